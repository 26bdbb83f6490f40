"""The checked-in stubs of reshard.proto are current, and the dependency floors admit
them (protobuf refuses gencode newer than its runtime; the gRPC stub refuses an older
grpcio)."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import tempfile
from importlib import metadata

import pytest
from google.protobuf import descriptor_pb2

from reshard.service import regen
from reshard.service.v1 import reshard_pb2, reshard_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUBS = ROOT / "reshard" / "service" / "v1"


def _without_json_names(fdp: descriptor_pb2.FileDescriptorProto) -> bytes:
    """The descriptor as the Python generator embeds it (protoc's descriptor sets add
    each field's json_name)."""
    def strip(messages):
        for m in messages:
            for f in m.field:
                f.ClearField("json_name")
            strip(m.nested_type)
    strip(fdp.message_type)
    return fdp.SerializeToString()


def test_checked_in_stubs_describe_the_proto():
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools is not installed (the dev extra)")
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "reshard.desc"
        assert regen.run_protoc([f"-I{ROOT}", f"--descriptor_set_out={out}",
                                 str(ROOT / regen.PROTO)]) == 0
        fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    assert _without_json_names(fresh) == reshard_pb2.DESCRIPTOR.serialized_pb, (
        "reshard.proto changed but the stubs did not: run `python -m reshard.service.regen`")


def _grpc_generated_version() -> str:
    text = (STUBS / "reshard_pb2_grpc.py").read_text()
    return re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", text).group(1)


def _protobuf_gencode_version() -> tuple[int, ...]:
    text = (STUBS / "reshard_pb2.py").read_text()
    m = re.search(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,"
                  r"\s*(\d+),\s*(\d+),\s*(\d+),", text)
    return tuple(int(g) for g in m.groups())


def test_stubs_are_what_the_pinned_generator_makes():
    pytest.importorskip("grpc_tools")
    tools = metadata.version("grpcio-tools")
    if tools != _grpc_generated_version():
        pytest.skip(f"grpcio-tools {tools} is not the {_grpc_generated_version()} that made "
                    f"the stubs (constraints.txt pins it); the descriptor test still checks them")
    assert regen.differences() == []


def test_every_rpc_of_the_proto_has_a_handler_and_a_stub_method():
    methods = set(reshard_pb2.DESCRIPTOR.services_by_name["Reshard"].methods_by_name)
    assert methods == {"Plan", "PlanMany", "Estimate", "EstimateMany", "Execute", "Free",
                       "GetVersion", "Search"}
    from reshard.service.servicer import ReshardServicer

    for name in methods:
        assert getattr(ReshardServicer, name) is not getattr(
            reshard_pb2_grpc.ReshardServicer, name), f"{name} is not implemented"
    assert reshard_pb2.DESCRIPTOR.package == "reshard.v1"


def _floor(requires: str, package: str) -> tuple[int, ...]:
    m = re.search(rf'"{re.escape(package)}>=([\d.]+)', requires)
    assert m, f"setup.py install_requires has no floor for {package}"
    return tuple(int(x) for x in m.group(1).split("."))


def test_dependency_floors_admit_the_stubs():
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    requires = setup.split("install_requires=[", 1)[1].split("]", 1)[0]
    assert _floor(requires, "protobuf") >= _protobuf_gencode_version()
    grpc_floor = tuple(int(x) for x in _grpc_generated_version().split("."))
    assert _floor(requires, "grpcio") >= grpc_floor
    assert _floor(requires, "grpcio-health-checking") >= grpc_floor


def test_protoc_runs_beside_nixl():
    """protoc and NIXL's native libraries abort when loaded into one process (both
    orders); regen runs protoc in a process of its own, so a process that holds NIXL
    (a nixl backend's rank, the test run itself) can still regenerate and check stubs."""
    import subprocess
    import sys

    if importlib.util.find_spec("grpc_tools") is None or importlib.util.find_spec("nixl") is None:
        pytest.skip("needs grpcio-tools (dev extra) and nixl (nixl extra)")
    code = ("import sys, nixl._api; from reshard.service import regen; "
            "sys.exit(regen.run_protoc(['--version']))")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                          text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "libprotoc" in done.stdout

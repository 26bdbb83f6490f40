"""The nccl backend held to the real ``cupy.cuda.nccl``, without a GPU (``gpu_contract``).

The real cupy (the ``cuda12`` extra) imports here, reports its NCCL, makes real unique
ids and documents every ``NcclCommunicator`` method's signature in the first line of
its docstring; only device calls need a driver. So:

- every call the backend makes on ``cupy.cuda.nccl`` and on its communicators is
  collected from the backend's source (its AST, not a hand list) and checked against
  the real signature: the method exists, takes that many arguments, and each argument
  is the kind of value the real parameter at that position is (a buffer pointer, a
  count, a datatype, an op, a rank, a stream);
- every ``NCCL_*`` constant the backend names exists, and the fake cupy of
  tests/cpu/fake_cupy (which the backend's logic tests run on) has the real values and
  the real surface: its functions, communicator methods and their parameters;
- a real unique id travels through reshard's rendezvous to every rank's
  ``NcclCommunicator(ndev, commId, rank)`` unchanged (the constructor, which needs a
  GPU, is intercepted).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import pathlib
import re
import threading
from typing import ClassVar

import pytest

pytestmark = pytest.mark.gpu_contract

ROOT = pathlib.Path(__file__).resolve().parents[2]
BACKEND = ROOT / "comm" / "backends" / "nccl.py"
FAKE = ROOT / "tests" / "cpu" / "fake_cupy" / "cupy" / "cuda" / "nccl.py"


@pytest.fixture(scope="module")
def real():
    """The real ``cupy.cuda.nccl`` (skipped where the cuda12 extra is not installed)."""
    nccl = pytest.importorskip("cupy.cuda.nccl")
    assert "fake_cupy" not in str(nccl.__file__), "the fake cupy shadows the real one"
    return nccl


# ----- the real signatures -------------------------------------------------------------
def _params(doc: str | None, name: str) -> list[str]:
    """Parameter names of ``name(...)`` as the first line of a cupy docstring gives
    them (``bcast(self, intptr_t buff, size_t count, ...)``), without ``self``."""
    first = (doc or "").strip().splitlines()[0] if doc else ""
    m = re.match(rf"(?:\w+\.)?{re.escape(name)}\((.*)\)", first)
    assert m, f"no signature line for {name}: {first!r}"
    out = []
    for part in filter(None, (p.strip() for p in m.group(1).split(","))):
        token = part.split("=")[0].strip().split()[-1]
        if token != "self":
            out.append(token)
    return out


def real_signature(real, owner: str, name: str) -> list[str]:
    """Parameter names of a module function, or of a communicator method, or (name
    ``"NcclCommunicator"``) of the constructor."""
    if name == "NcclCommunicator":
        return _params(real.NcclCommunicator.__doc__, "NcclCommunicator")
    obj = getattr(real.NcclCommunicator if owner == "comm" else real, name)
    return _params(obj.__doc__, name)


# ----- what the backend calls, from its source ----------------------------------------
def _receiver(node: ast.expr) -> str | None:
    """``"nccl"`` for ``self._nccl``, ``"comm"`` for a communicator (a name ``comm`` or
    ``self._world_comm``), else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
            node.value.id == "self":
        return {"_nccl": "nccl", "_world_comm": "comm"}.get(node.attr)
    if isinstance(node, ast.Name) and node.id == "comm":
        return "comm"
    return None


def backend_calls() -> list[tuple[str, str, list[str], list[str], int]]:
    """``(owner, name, argument sources, keyword names, line)`` of every call the
    backend makes on ``cupy.cuda.nccl`` or on a communicator."""
    src = BACKEND.read_text()
    calls = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = _receiver(node.func.value)
            if owner is not None:
                calls.append((owner, node.func.attr,
                              [ast.get_source_segment(src, a) or "" for a in node.args],
                              [k.arg or "" for k in node.keywords], node.lineno))
    return calls


def backend_constants() -> set[str]:
    """Every ``NCCL_*`` name the backend reads off ``cupy.cuda.nccl``."""
    names = set()
    for node in ast.walk(ast.parse(BACKEND.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("NCCL_"):
            names.add(node.attr)
    return names


KINDS = (  # (what an argument's source says, what a real parameter's name says)
    ("stream", ("stream",)),
    ("op", ("op",)),
    ("datatype", ("datatype",)),
    ("rank", ("root", "peer", "rank")),
    ("count", ("count", "ndev")),
    ("buffer", ("buff", "buf")),
    ("id", ("commId",)),
)


def _arg_kind(source: str) -> str:
    s = source.replace(" ", "")
    if "stream" in s:
        return "stream"
    if s == "nccl_op":
        return "op"
    if "NCCL_" in s or s == "nccl_type":
        return "datatype"
    if ".index(" in s:
        return "rank"
    if s in ("n", "count") or s.endswith(".size") or s.startswith("len("):
        return "count"
    if s in ("ptr", "src", "dst") or s.endswith("ptr"):
        return "buffer"
    if s == "uid":
        return "id"
    raise AssertionError(f"cannot tell what argument {source!r} is; extend KINDS")


def _param_kind(name: str) -> str:
    for kind, marks in KINDS:
        if any(m.lower() in name.lower() for m in marks):
            return kind
    raise AssertionError(f"cannot tell what parameter {name!r} is; extend KINDS")


def test_every_call_the_backend_makes_matches_the_real_signature(real):
    calls = backend_calls()
    names = {(o, n) for o, n, *_ in calls}
    # the calls the backend is known to need, so that the scan cannot silently miss them
    assert {("nccl", "get_unique_id"), ("nccl", "NcclCommunicator"), ("nccl", "groupStart"),
            ("nccl", "groupEnd"), ("comm", "broadcast"), ("comm", "send"), ("comm", "recv"),
            ("comm", "allGather"), ("comm", "reduce")} <= names
    for owner, name, args, keywords, line in calls:
        where = f"nccl.py:{line}: {owner}.{name}"
        if owner == "comm" and not hasattr(real.NcclCommunicator, name):
            pytest.fail(f"{where}: cupy's NcclCommunicator has no method {name}")
        if owner == "nccl":
            assert hasattr(real, name), f"{where}: cupy.cuda.nccl has no {name}"
            if not args and not keywords and name not in ("NcclCommunicator",):
                params = real_signature(real, owner, name)
                assert not params, f"{where}: called without arguments, takes {params}"
                continue
        params = real_signature(real, owner, name)
        required = [p for p in params if p != "config"]
        assert len(required) <= len(args) <= len(params), \
            f"{where}: {len(args)} arguments {args}, cupy's takes {params}"
        assert not keywords, f"{where}: keywords {keywords}; cupy's are positional"
        for arg, param in zip(args, params):
            assert _arg_kind(arg) == _param_kind(param), \
                f"{where}: argument {arg!r} is passed as cupy's {param!r}"


def test_every_constant_the_backend_names_exists_and_the_dtypes_are_ncclas(real):
    used = backend_constants()
    assert {"NCCL_UINT8", "NCCL_SUM", "NCCL_MAX", "NCCL_FLOAT32"} <= used
    missing = sorted(n for n in used if not hasattr(real, n))
    assert not missing, f"cupy.cuda.nccl lacks {missing}"
    # NCCL's own enum values (nccl.h): the backend relies on these kinds existing
    assert (real.NCCL_SUM, real.NCCL_MAX) == (0, 2)
    assert real.NCCL_BFLOAT16 == 9 and real.NCCL_UINT8 == 1 and real.NCCL_FLOAT32 == 7
    # NCCL >= 2.24 has fp8 types, cupy does not name them yet: fp8 moves as uint8 bits,
    # and a float8 sum is refused before anything moves (Capabilities.bits)
    from reshard.comm.backends.nccl import NcclBackend

    assert "float8_e4m3fn" in NcclBackend.capabilities.bits
    assert real.get_version() >= 22400 or not hasattr(real, "NCCL_FLOAT8E4M3")


def _fake_module():
    spec = importlib.util.spec_from_file_location("fake_cupy_nccl", FAKE)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_fake_cupy_matches_the_real_surface(real):
    fake = _fake_module()
    for name, value in vars(fake).items():
        if name.startswith("NCCL_"):
            assert getattr(real, name) == value, f"fake {name} = {value}, real {getattr(real, name)}"
        elif not name.startswith("_") and inspect.isfunction(value) and \
                value.__module__ == fake.__name__:
            assert hasattr(real, name), f"the fake has {name}, cupy.cuda.nccl does not"
            ours = [p for p in inspect.signature(value).parameters if p != "self"]
            assert ours == real_signature(real, "nccl", name), name
    for name, method in vars(fake.NcclCommunicator).items():
        if name.startswith("_") and name != "__init__":
            continue
        ours = [p for p in inspect.signature(method).parameters if p != "self"]
        if name == "__init__":
            want = [p for p in real_signature(real, "nccl", "NcclCommunicator") if p != "config"]
        else:
            assert hasattr(real.NcclCommunicator, name), f"real communicator lacks {name}"
            want = real_signature(real, "comm", name)
        # the fake names its buffers sendbuf/recvbuf, cupy sendbuff/recvbuff: same kinds
        assert [_param_kind(p) for p in ours] == [_param_kind(p) for p in want], \
            f"fake NcclCommunicator.{name}{tuple(ours)} vs cupy's {tuple(want)}"


class _Recorder:
    """Stands in for ``NcclCommunicator`` (whose constructor needs a GPU): records."""

    made: ClassVar[list[tuple]] = []
    lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, ndev: int, commId, rank: int) -> None:  # cupy's parameter names
        with self.lock:
            self.made.append((ndev, commId, rank))


def test_a_real_unique_id_reaches_every_ranks_communicator_unchanged(real, monkeypatch):
    from reshard.comm.backends.nccl import NcclBackend
    from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer

    uid = real.get_unique_id()
    assert isinstance(uid, bytes) and len(uid) == 128
    made_ids: list = []
    real_get = real.get_unique_id

    def traced() -> bytes:
        got = real_get()
        made_ids.append(got)
        return got

    monkeypatch.setattr(real, "get_unique_id", traced)
    monkeypatch.setattr(real, "NcclCommunicator", _Recorder)
    _Recorder.made = []
    server = TcpRendezvousServer()
    group = (3, 5, 8, 13)
    errors: list[BaseException] = []

    def rank(device: int) -> None:
        try:
            b = object.__new__(NcclBackend)  # the constructor needs a GPU: its parts
            b._nccl, b.device, b.timeout, b._channel = real, device, 20.0, ""
            b._dev = contextlib.nullcontext()
            b._comms = {}
            b._rdv = server.address.connect(20.0)
            b._make_comm(group)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(d,)) for d in group]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    server.close()
    assert not errors, errors
    assert len(made_ids) == 1, "one unique id per communicator, made by its first member"
    assert sorted(r for _, _, r in _Recorder.made) == [0, 1, 2, 3]
    for ndev, comm_id, _ in _Recorder.made:
        assert ndev == len(group)
        assert type(comm_id) is bytes and comm_id == made_ids[0]

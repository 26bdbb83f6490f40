"""The gRPC service on loopback: plans equal the Python API's, 50 concurrent clients,
junk and oversized messages, health, token and TLS.

Oracles: ``reshard.plan`` / ``plan_many`` and the costs of their plans in this
process; for errors, the class and message the Python API (or the service's own
decoder, in process) raises for the same input.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import threading

import grpc
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.errors import ClusterError, PartialError, ReshardError, SpecError
from reshard.service import Client, ServeOptions, Server, ServiceError, convert, plan_codec
from reshard.service.v1 import reshard_pb2 as pb
from reshard.service.v1 import reshard_pb2_grpc as pb_grpc

from ..common import STRATEGIES
from ..unit.test_planner_properties import planning_problems
from ._helpers import WORLD, paper_cases, problem_settings

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def server():
    with Server(ServeOptions(port=0, backend=None, workers=8)).start() as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with Client(server.address, timeout=60) as c:
        yield c


def expected_error(fn):
    """``(class, message)`` of what ``fn`` raises in this process."""
    with pytest.raises(ReshardError) as e:
        fn()
    return type(e.value), str(e.value)


# ----- plans through the service equal the Python API's ---------------------------------
@pytest.mark.timeout(120)
@problem_settings(40)
@given(planning_problems(), st.sampled_from(STRATEGIES))
def test_plans_through_the_service_equal_the_python_api(client, problem, strategy):
    shape, dtype, src, dst, cluster = problem
    want = reshard.plan(shape, dtype, src, dst, cluster=cluster, strategy=strategy)
    got = client.plan(shape, dtype, src, dst, cluster=cluster, strategy=strategy)
    assert got == want and got.to_json() == want.to_json()
    assert client.estimate(shape, dtype, src, dst, cluster=cluster, strategy=strategy) == (
        want.estimate(), want.lower_bound())
    reqs = [(shape, dtype, src, dst), (shape, dtype, dst, src)]
    assert client.plan_many(reqs, cluster=cluster, strategy=strategy) == reshard.plan_many(
        reqs, cluster=cluster, strategy=strategy)


@pytest.mark.timeout(60)
def test_plan_many_streams_in_chunks(server, client):
    case = paper_cases()[0]
    src, dst = case.layouts()
    reqs = [(case.shape, "int32", src, dst)] * 5
    want = reshard.plan_many(reqs, cluster=WORLD)
    request = convert.request_to_pb(reqs, WORLD, "broadcast")
    request.max_chunk_tasks = 2
    request.include_cost = True
    with grpc.insecure_channel(server.address) as ch:
        chunks = list(pb_grpc.ReshardStub(ch).PlanMany(request, timeout=30))
    assert len(chunks) == -(-len(want.tasks) // 2) and chunks[0].cost.seconds == want.estimate()
    assert client.plan_many(reqs, cluster=WORLD) == want


# ----- 50 concurrent clients --------------------------------------------------------------
def _workload():
    """Valid calls with their in-process answers, and invalid ones with the error the
    in-process API raises."""
    ops = []
    for case in paper_cases():
        src, dst = case.layouts()
        for strategy in STRATEGIES:
            p = reshard.plan(case.shape, "int32", src, dst, cluster=WORLD, strategy=strategy)
            args = (case.shape, "int32", src, dst, WORLD, strategy)
            ops.append(("plan", args, p))
            ops.append(("estimate", args, (p.estimate(), p.lower_bound())))
    src, dst = paper_cases()[0].layouts()
    far = Layout(DeviceMesh((2,), devices=[0, 99]), "S0RR")
    bad = [  # (call, args): valid for the client, refused by the server
        ("plan", ((16, 16, 8), "int32", src, far, WORLD, "broadcast")),  # device 99
        ("estimate", ((16, 16), "int32", src, dst, WORLD, "broadcast")),  # rank 2 vs 3
        ("plan", ((4, 4, 4), "bool", Layout(DeviceMesh((2, 2)), "S0RR+P1"), dst, WORLD,
                  "allgather")),  # a partial sum of bools
    ]
    for call, args in bad:
        *a, cluster, strategy = args
        err = expected_error(lambda a=a, c=cluster, s=strategy: reshard.plan(
            *a, cluster=c, strategy=s))
        ops.append((call, args, err))
    junk = convert.request_to_pb([((8, 8), "int32", src, dst)], WORLD, "broadcast")
    junk.tensors[0].src.spec.Clear()
    junk.tensors[0].src.spec.text = "S0S0"
    err = expected_error(lambda: convert.request_from_pb(junk, None))
    ops.append(("raw", junk, err))
    return ops


@pytest.mark.timeout(120)
def test_fifty_concurrent_clients_mixing_valid_and_invalid_calls(server):
    ops = _workload()
    kinds = {e[0] for *_, e in ops if isinstance(e, tuple) and len(e) == 2
             and isinstance(e[0], type)}
    assert {ClusterError, SpecError, PartialError} <= kinds  # the mix is what it says
    failures: list[str] = []
    answered = [0]
    lock = threading.Lock()

    def one_client(k: int) -> None:
        rng = random.Random(k)
        with Client(server.address, timeout=60) as c:
            for call, args, want in rng.sample(ops, 12):
                try:
                    if call == "raw":
                        c._call(c._stub.Plan, args, None)
                        got = None
                    elif call == "plan":
                        *a, cluster, strategy = args
                        got = c.plan(*a, cluster=cluster, strategy=strategy)
                    else:
                        *a, cluster, strategy = args
                        got = c.estimate(*a, cluster=cluster, strategy=strategy)
                    ok = got == want
                except ReshardError as e:
                    got = (type(e), str(e))
                    ok = got == want
                with lock:
                    answered[0] += 1
                    if not ok:
                        failures.append(f"client {k}: {call}: got {got!r:.200}, want {want!r:.200}")

    threads = [threading.Thread(target=one_client, args=(k,)) for k in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert failures == []
    assert answered[0] == 50 * 12
    with Client(server.address) as c:
        assert c.health()
        p = paper_cases()[1]
        assert c.estimate(p.shape, "int32", *p.layouts(), cluster=WORLD)[0] > 0


# ----- junk, oversized, limits --------------------------------------------------------------
@pytest.fixture
def small_server():
    options = ServeOptions(port=0, backend="local", max_message_bytes=96 << 10,
                           max_inline_bytes=16 << 10)
    with Server(options).start() as s:
        yield s


def _junk_socket(address: str, payload: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(payload)
        got = b""
        while True:  # the server answers with an HTTP/2 GOAWAY (or nothing) and closes
            try:
                part = s.recv(4096)
            except (ConnectionResetError, TimeoutError):
                break
            if not part:
                break
            got += part
    return got


@pytest.mark.timeout(60)
def test_junk_and_oversized_messages_are_refused_and_the_server_keeps_serving(small_server):
    rng = random.Random(7)
    _junk_socket(small_server.address, bytes(rng.randrange(256) for _ in range(8192)))
    _junk_socket(small_server.address, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with grpc.insecure_channel(small_server.address) as ch:  # junk where a message goes
        raw = ch.unary_unary("/reshard.v1.Reshard/Plan")
        with pytest.raises(grpc.RpcError) as e:
            raw(b"\xff\xfe junk \x00" * 50, timeout=10)
        assert e.value.code() not in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE)
    src = Layout(DeviceMesh((2,)), "S0")
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "R")
    big = reshard.plan((1 << 16,), "float32", src, dst)  # 256 KiB inline: over 96 KiB
    with Client(small_server.address, timeout=30) as c:
        with pytest.raises(ServiceError) as e:
            c.execute(big, [np.zeros(1 << 16, np.float32)], fetch=False)
        assert e.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        mid = reshard.plan((1 << 14,), "float32", src, dst)  # 64 KiB: over the inline limit
        with pytest.raises(ServiceError, match=r"over the server's limit of 16384 \(--max"):
            c.execute(mid, [np.zeros(1 << 14, np.float32)], fetch=False)
        # a plan over the message limit comes through the stream
        a2a_src = Layout(DeviceMesh((8, 8)), "S01R")
        a2a_dst = Layout(DeviceMesh((8, 8), devices=range(64, 128)), "RS10")
        cluster = Cluster.preset("dgx-h100", 16)
        want = reshard.plan((4096, 4096), "uint16", a2a_src, a2a_dst, cluster=cluster)
        assert plan_codec.plan_to_pb(want).ByteSize() > 96 << 10  # over the limit
        assert c.plan((4096, 4096), "uint16", a2a_src, a2a_dst, cluster=cluster) == want
        assert c.health()
        assert c.estimate((8,), "float32", src, dst) == (
            reshard.plan((8,), "float32", src, dst).estimate(),
            reshard.plan((8,), "float32", src, dst).lower_bound())


# ----- health, token, TLS ------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_health_says_serving_until_stopped():
    s = Server(ServeOptions(port=0, backend=None)).start()
    with Client(s.address) as c:
        assert c.health() and c.health("reshard.v1.Reshard")
        assert not c.health("no.such.Service")  # NOT_FOUND
        version = c.version()
        assert (version.api, version.plan_format, version.backend) == ("reshard.v1", 2, "")
        assert set(version.split_rules) == {pb.SPLIT_RULE_FLAT, pb.SPLIT_RULE_NESTED}
        s.stop(grace=1)
        assert not c.health(timeout=2)


@pytest.mark.timeout(60)
def test_token_is_required_except_for_health():
    src = Layout(DeviceMesh((2,)), "S0")
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "R")
    with Server(ServeOptions(port=0, backend=None, token="s3cret")).start() as s:
        for token in (None, "wrong"):
            with Client(s.address, token=token) as c:
                assert c.health()
                for call in (lambda: c.estimate((8,), "int8", src, dst),
                             lambda: c.plan_many([((8,), "int8", src, dst)])):  # a stream
                    with pytest.raises(ServiceError) as e:
                        call()
                    assert e.value.code is grpc.StatusCode.UNAUTHENTICATED
        with Client(s.address, token="s3cret") as c:
            assert c.plan((8,), "int8", src, dst) == reshard.plan((8,), "int8", src, dst)


@pytest.mark.timeout(60)
def test_tls(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=30)
    from reshard.service.options import TlsFiles

    src = Layout(DeviceMesh((2,)), "S0")
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "R")
    options = ServeOptions(port=0, backend=None, tls=TlsFiles(str(cert), str(key)))
    with Server(options).start() as s:
        with Client(s.address, root_certificates=str(cert)) as c:
            assert c.plan((8,), "int8", src, dst) == reshard.plan((8,), "int8", src, dst)
        with Client(s.address, timeout=3) as plain:
            with pytest.raises(ServiceError) as e:
                plain.estimate((8,), "int8", src, dst)
            assert e.value.code is grpc.StatusCode.UNAVAILABLE

"""Execute on the server's Runtime: arrays in and out inline or by handle, the inline
limit, deadlines that become Runtime timeouts, and every error class across the wire.

Oracles: the source value itself (a reshard moves a value, it never changes it), and
the error class and message raised on the server side.
"""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import reshard
from reshard import DeviceMesh, Layout
from reshard.errors import ExecutionError, ReshardBaseError, ReshardError, ShapeError
from reshard.service import Client, ServeOptions, Server, ServiceError, plan_codec
from reshard.service.runtime_host import DEADLINE_MARGIN
from reshard.service.status import ERROR_CLASSES, ERROR_KEY
from reshard.service.v1 import reshard_pb2 as pb
from reshard.service.v1 import reshard_pb2_grpc as pb_grpc

from ..common import STRATEGIES, problems, sample
from ._helpers import problem_settings

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def client():
    with Server(ServeOptions(port=0, backend="local")).start() as s, \
            Client(s.address, timeout=60) as c:
        c.server = s
        yield c


@pytest.mark.timeout(120)
@problem_settings(25)
@given(problems(tuple(range(8)), max_ndim=2, max_size=8), st.sampled_from(STRATEGIES),
       st.integers(0, 2 ** 32 - 1))
def test_executed_plans_deliver_the_value(client, problem, strategy, seed):
    shape, dtype, src, dst = problem
    value = sample(np.random.default_rng(seed), shape, dtype)
    p = reshard.plan(shape, dtype, src, dst, strategy=strategy)
    (out,) = client.execute(p, [value])
    assert out.handle == "" and out.layout == dst
    assert out.data.dtype == value.dtype and out.data.tobytes() == value.tobytes()


@pytest.mark.timeout(60)
def test_handles_chain_reshards_and_are_freed(client):
    src = Layout(DeviceMesh((2, 2)), "S0S1")
    mid = Layout(DeviceMesh((4,), devices=range(4, 8)), "RS0")
    dst = Layout(DeviceMesh((2,), devices=[0, 5]), "S0R")
    value = np.arange(7 * 5, dtype=np.float64).reshape(7, 5)
    there = reshard.plan(value.shape, value.dtype, src, mid)
    back = reshard.plan(value.shape, value.dtype, mid, dst)
    (kept,) = client.execute(there, [value], fetch=False, keep=True)
    assert kept.handle and kept.data is None and client.server.host.handles == 1
    (out,) = client.execute(back, [kept], free_inputs=True)
    np.testing.assert_array_equal(out.data, value)
    assert client.server.host.handles == 0
    with pytest.raises(ReshardError, match=f"no array has handle '{kept.handle}'"):
        client.execute(back, [kept])
    assert client.free(kept) == 0
    with pytest.raises(ShapeError, match="input 0 has 8 bytes, but the plan's tensor 0 is"):
        client.execute(there, [np.zeros(1)])
    (again,) = client.execute(there, [value], keep=True)
    assert client.free(again, again.handle) == 1 and client.server.host.handles == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scale", ["tensor", "block128"])
def test_a_scaled_cast_through_the_service(client, scale):
    """Planned by the server (cast and scale in the request), executed there: the
    values arrive as float8, then the scales, each the reference's bits; the estimate
    counts the narrow bytes."""
    from reshard.casting import reference_cast
    from reshard.dtypes import Cast, ScaleMode

    src = Layout(DeviceMesh((2, 2)), "S0S1")
    dst = Layout(DeviceMesh((4,), devices=range(4, 8)), "RS0")
    value = (np.random.default_rng(3).standard_normal((300, 260)) * 7).astype("bfloat16")
    p = client.plan(value.shape, "bfloat16", src, dst, cast="float8_e4m3fn", scale=scale)
    assert p.inputs == (0,) and len(p.outputs) == 2
    q, scales = client.execute(p, [value])
    want, want_scales = reference_cast(value, Cast("float8_e4m3fn", ScaleMode(scale)))
    assert q.dtype == "float8_e4m3fn" and q.layout == dst
    assert q.data.tobytes() == want.tobytes()
    assert scales.dtype == "float32" and np.array_equal(scales.data, want_scales)
    narrow = client.estimate(value.shape, "bfloat16", src, dst, cast="float8_e4m3fn",
                             scale=scale)
    wide = client.estimate(value.shape, "bfloat16", src, dst)
    assert narrow[1] < wide[1]  # the bound counts the bytes after the cast


@pytest.mark.timeout(60)
def test_a_plan_that_fails_verification_is_refused(client):
    src = Layout(DeviceMesh((2,)), "S0")
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "R")
    request = pb.ExecuteRequest(fetch=True)
    plan_codec.plan_to_pb(reshard.plan((8,), "int32", src, dst), into=request.plan)
    del request.plan.tasks[-1]  # a destination element is never delivered
    request.inputs.add(data=bytes(32))
    with pytest.raises(reshard.PlanError):
        client._call(client._stub.Execute, request, None)


# ----- a Runtime under the test's control ------------------------------------------------
class Handle:
    def __init__(self, key):
        self.key = key
        self.scales = None


class FakeRuntime:
    """Records the timeout of each call; ``behaviour`` decides what execute does."""

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.timeouts: list[float | None] = []
        self.closed = False
        self.failed = None
        self.n = 0

    def put(self, array, layout, timeout=None):
        self.n += 1
        return Handle(f"in{self.n}")

    def execute(self, plan, xs, timeout=None):
        self.timeouts.append(timeout)
        self.behaviour(timeout)
        return [Handle("out") for _ in plan.inputs]

    def get(self, x, timeout=None):
        return np.zeros(2, np.int32)

    def free(self, *xs):
        pass

    def close(self, grace=None):  # the server gives what is left of its grace
        self.closed = True
        self.grace = grace


def serve_fake(behaviour):
    made: list[FakeRuntime] = []

    def factory():
        made.append(FakeRuntime(behaviour))
        return made[-1]
    server = Server(ServeOptions(port=0, runtime_timeout=30.0), runtime_factory=factory).start()
    return server, made


def stuck(timeout):
    """A worker that makes no progress: the Runtime reports it at its timeout."""
    time.sleep(timeout)
    raise ExecutionError(f"plan 0 failed: device 1 made no progress for {timeout:g}s (stuck)")


SMALL = reshard.plan((2,), "int32", Layout(DeviceMesh((1,)), "R"),
                     Layout(DeviceMesh((1,), devices=[1]), "R"))


@pytest.mark.timeout(60)
def test_the_callers_deadline_becomes_the_runtime_timeout():
    healthy = threading.Event()
    server, made = serve_fake(lambda timeout: None if healthy.is_set() else stuck(timeout))
    try:
        with Client(server.address) as c:
            start = time.monotonic()
            with pytest.raises(ExecutionError, match="made no progress"):
                c.execute(SMALL, [np.zeros(2, np.int32)], timeout=1.5)
            took = time.monotonic() - start
        (rt,) = made[:1]
        # the caller's deadline less the margin (gRPC's server clock is a cached one that
        # may lag by some ms, so the time it reports left may exceed the caller's 1.5 s)
        assert 1.5 - DEADLINE_MARGIN - 0.1 < rt.timeouts[0] <= 1.5 - DEADLINE_MARGIN + 0.05
        assert took < 1.5  # the answer came before the caller's deadline
        assert rt.closed  # a timed-out Runtime is shut down ...
        request = pb.ExecuteRequest(fetch=True)
        plan_codec.plan_to_pb(SMALL, into=request.plan)
        request.inputs.add(data=bytes(8))
        with grpc.insecure_channel(server.address) as ch, pytest.raises(grpc.RpcError) as e:
            pb_grpc.ReshardStub(ch).Execute(request, timeout=1.0)
        assert e.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert dict(e.value.trailing_metadata())[ERROR_KEY] == "ExecutionError"
        assert len(made) == 2 and made[1].closed  # ... and the next call made a new one
        healthy.set()
        with Client(server.address) as c:  # no deadline: the server's own timeout
            c.execute(SMALL, [np.zeros(2, np.int32)], timeout=None)
            c.timeout = None
            c.execute(SMALL, [np.zeros(2, np.int32)])
        assert len(made) == 3 and made[2].timeouts == [30.0, 30.0]
    finally:
        server.stop(grace=1)


def _raiser(cls):
    def behaviour(timeout):
        raise cls(f"{cls.__name__}: the rule, the value 7, the fix")
    return behaviour


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(set(ERROR_CLASSES) - {"ServiceError"}))
def test_server_side_errors_arrive_as_the_same_class(name):
    cls = ERROR_CLASSES[name]
    server, _ = serve_fake(_raiser(cls))
    try:
        with Client(server.address, timeout=20) as c, pytest.raises(cls) as e:
            c.execute(SMALL, [np.zeros(2, np.int32)])
        assert type(e.value) is cls
        assert str(e.value) == f"{name}: the rule, the value 7, the fix"
    finally:
        server.stop(grace=1)


@pytest.mark.timeout(60)
def test_without_a_runtime_execute_is_a_failed_precondition():
    with Server(ServeOptions(port=0, backend=None)).start() as s, Client(s.address) as c:
        with pytest.raises(ServiceError, match="runs no Runtime") as e:
            c.execute(SMALL, [np.zeros(2, np.int32)])
        assert e.value.code is grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.timeout(60)
def test_stop_lets_calls_in_flight_finish():
    release = threading.Event()
    server, made = serve_fake(lambda timeout: release.wait(10))
    results: list[object] = []

    def call():
        with Client(server.address, timeout=20) as c:
            try:
                results.append(c.execute(SMALL, [np.zeros(2, np.int32)]))
            except ReshardBaseError as e:  # pragma: no cover - reported below
                results.append(e)

    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 10
    while not (made and made[0].timeouts) and time.monotonic() < deadline:
        time.sleep(0.01)
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 10})
    stopper.start()
    time.sleep(0.2)
    with Client(server.address, timeout=3) as late:
        assert not late.health()
        with pytest.raises(ServiceError) as e:
            late.estimate((2,), "int32", SMALL.src, SMALL.dst)
        assert e.value.code is grpc.StatusCode.UNAVAILABLE
    release.set()
    t.join(10)
    stopper.join(10)
    assert len(results) == 1 and isinstance(results[0], list), results
    assert made[0].closed


@pytest.mark.timeout(120)
def test_a_gloo_runtime_behind_the_service():
    cluster = reshard.Cluster.regular(2, 2)
    src = Layout(DeviceMesh((1, 2)), "S0R+P1")  # a partial sum over devices 0 and 1
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "RS0")
    value = np.arange(6 * 5, dtype=np.float32).reshape(6, 5)
    options = ServeOptions(port=0, backend="gloo", cluster=cluster, runtime_timeout=30)
    with Server(options).start() as server, Client(server.address, timeout=60) as c:
        p = reshard.plan(value.shape, value.dtype, src, dst, cluster=cluster)
        (y,) = c.execute(p, [value], keep=True)
        np.testing.assert_array_equal(y.data, value)
        back = reshard.plan(value.shape, value.dtype, dst, Layout(DeviceMesh((4,)), "RS0"),
                            cluster=cluster, strategy="send_recv")
        (z,) = c.execute(back, [y], free_inputs=True)
        np.testing.assert_array_equal(z.data, value)
        assert c.version().backend == "gloo" and server.host.handles == 0


@pytest.mark.timeout(120)
def test_a_stuck_worker_past_the_deadline_gets_the_servers_error_and_a_retry_works():
    """A gloo worker stopped mid-Execute: the caller gets the server's own error (naming
    the stuck device) before its deadline, not gRPC's bare DEADLINE_EXCEEDED, and an
    Execute right after runs on a new Runtime."""
    import os
    import signal

    cluster = reshard.Cluster.regular(2, 2)
    options = ServeOptions(port=0, backend="gloo", cluster=cluster, runtime_timeout=30)
    with Server(options).start() as server, Client(server.address, timeout=60) as client:
        src = Layout(DeviceMesh((2,), devices=[0, 1]), "S0R")
        dst = Layout(DeviceMesh((2,), devices=[2, 3]), "RS0")
        value = np.arange(64, dtype=np.float32).reshape(8, 8)
        p = reshard.plan(value.shape, value.dtype, src, dst, cluster=cluster)
        client.execute(p, [value])  # workers up
        victim = server.host._runtime.group.pids[3]
        os.kill(victim, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(ExecutionError, match="device 3 made no progress") as e:
                client.execute(p, [value], timeout=3.0)
            assert time.monotonic() - t0 < 3.0  # the server's answer, inside the deadline
            assert "failed: " in str(e.value) and not str(e.value).endswith("failed: ")
        finally:
            os.kill(victim, signal.SIGCONT)
        (out,) = client.execute(p, [value])  # a retry at once: a new Runtime
        np.testing.assert_array_equal(out.data, value)

"""A service one request cannot take down: requests sized before work and refused over
the budget, expensive ones in worker processes stopped at the caller's deadline and
capped in memory, few at a time while cheap calls keep flowing, and a stop bounded by
its grace (reshard.service.workpool, reshard.service.budget)."""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import threading
import time

import grpc
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.service import Client, ServeOptions, Server, ServiceError
from reshard.service.options import MIB

from .test_service_serve import start_serve

pytestmark = pytest.mark.cpu


def a2a(n: int) -> tuple[tuple, Cluster]:
    """An n -> n all-to-all (S01R -> RS10 over n/8 DGX H100 hosts): about n*n tasks."""
    cluster = Cluster.preset("dgx-h100", n // 8)
    src = Layout(DeviceMesh((n // 8, 8)), "S01R")
    dst = Layout(DeviceMesh((n // 8, 8)), "RS10")
    return ((8 * n, 4096), "bfloat16", src, dst), cluster


def estimate(client: Client, n: int, timeout: float | None = 30.0) -> tuple[float, float]:
    args, cluster = a2a(n)
    return client.estimate(*args, cluster=cluster, timeout=timeout)


@pytest.fixture(scope="module")
def served():
    options = ServeOptions(port=0, backend=None, job_workers=1, job_memory_bytes=1500 * MIB)
    with Server(options).start() as server, Client(server.address, timeout=30) as client:
        yield server, client


@pytest.mark.timeout(60)
def test_over_the_budget_refused_before_any_work(served):
    _, client = served
    t0 = time.monotonic()
    with pytest.raises(ServiceError, match=r"about 4198401 cells.*budget of 2097152") as e:
        estimate(client, 2048)
    assert e.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    # sized (in a job worker: 2048 devices are not sized inline), never planned: a
    # 2048 -> 2048 all-to-all plans for minutes. The bound is loose on purpose: at load
    # 14 the refusal took 1.3 s (this test once said 1 s and failed there)
    assert time.monotonic() - t0 < 15.0


@pytest.mark.timeout(60)
def test_the_deadline_stops_the_work(served):
    """A 1024 -> 1024 Estimate (about 7 s of planning) with a 1 s deadline: its worker
    is killed at the deadline, and the next request is served by a fresh one."""
    server, client = served
    pids = server.servicer.jobs.pids
    killed = server.servicer.jobs.killed
    t0 = time.monotonic()
    with pytest.raises(ServiceError) as e:
        estimate(client, 1024, timeout=1.0)
    assert e.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 1.5
    while server.servicer.jobs.killed == killed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.servicer.jobs.killed == killed + 1, "the worker ran on past the deadline"
    assert time.monotonic() - t0 < 2.5
    for pid in pids:  # its CPU stopped: the process is gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    seconds, bound = estimate(client, 64)  # a fresh worker
    assert seconds >= bound > 0


@pytest.mark.timeout(90)
def test_a_cancelled_call_stops_its_work_and_frees_the_pool(served):
    """A deadline-less 1024 -> 1024 Estimate whose client goes away after 1 s (its call
    cancelled): the worker is killed at once, and the next expensive request is served
    within 2 s (it was refused "busy" while the cancelled work ran on)."""
    server, _ = served
    killed = server.servicer.jobs.killed
    gone = Client(server.address, timeout=30)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            estimate(gone, 1024, timeout=None)
        except BaseException as e:  # noqa: BLE001 - the cancellation, looked at below
            errors.append(e)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    time.sleep(1.0)
    gone.close()  # cancels the call in flight
    t0 = time.monotonic()
    while server.servicer.jobs.killed == killed and time.monotonic() - t0 < 2.0:
        time.sleep(0.02)
    assert server.servicer.jobs.killed == killed + 1, "the cancelled work ran on"
    with Client(server.address, timeout=30) as client:
        seconds, bound = estimate(client, 256, timeout=20)  # the worker is free again
    assert seconds >= bound > 0
    t.join(10)


@pytest.mark.timeout(60)
def test_work_without_a_deadline_stops_at_the_servers_cap():
    options = ServeOptions(port=0, backend=None, job_workers=1, job_timeout=1.0)
    with Server(options).start() as server, Client(server.address, timeout=30) as client:
        t0 = time.monotonic()
        with pytest.raises(ServiceError, match=r"ran past the server's cap of 1 s "
                                               r"\(--job-timeout\)") as e:
            estimate(client, 1024, timeout=None)
        assert e.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - t0 < 3.0


@pytest.mark.timeout(90)
def test_busy_workers_refuse_and_cheap_calls_keep_flowing(served):
    """While the one worker plans a huge request, another huge request is refused at
    once, and small requests (planned inline) keep their latency."""
    _, client = served
    errors: list[BaseException] = []

    def huge() -> None:
        try:
            estimate(client, 1024, timeout=4.0)
        except ServiceError as e:
            errors.append(e)

    t = threading.Thread(target=huge)
    t.start()
    time.sleep(0.5)
    with pytest.raises(ServiceError, match="workers for expensive requests are busy") as e:
        estimate(client, 512)
    assert e.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    src = Layout(DeviceMesh((2, 2)), "S0R")
    dst = Layout(DeviceMesh((4,), devices=range(4, 8)), "RS0")
    latencies = []
    for k in range(40):
        t0 = time.monotonic()
        client.estimate((64 + k, 32), "float32", src, dst, timeout=5)  # new each time
        latencies.append(time.monotonic() - t0)
    t.join()
    assert errors and errors[0].code is grpc.StatusCode.DEADLINE_EXCEEDED
    p99 = statistics.quantiles(latencies, n=100)[98]
    # structure, not speed (timings belong in benchmarks): the small calls were served
    # while the worker was busy, none waited for it (a 4 s wait would show here)
    assert p99 < 1.0, f"cheap calls waited: p99 {p99:.3f}s"


@pytest.mark.timeout(90)
def test_a_request_over_the_memory_cap_is_refused_and_the_server_serves_on():
    options = ServeOptions(port=0, backend=None, job_workers=1, job_memory_bytes=400 * MIB)
    with Server(options).start() as server, Client(server.address, timeout=60) as client:
        with pytest.raises(ServiceError, match="more memory than a worker may use") as e:
            estimate(client, 512, timeout=60)
        assert e.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        seconds, bound = estimate(client, 64)
        assert seconds >= bound > 0


@pytest.mark.timeout(60)
def test_stop_is_bounded_by_its_grace():
    options = ServeOptions(port=0, backend=None, job_workers=1, grace=1.0)
    server = Server(options).start()
    client = Client(server.address, timeout=60)
    done = threading.Event()

    def huge() -> None:
        with contextlib.suppress(ServiceError):
            estimate(client, 1024, timeout=None)
        done.set()

    threading.Thread(target=huge, daemon=True).start()
    time.sleep(0.5)
    t0 = time.monotonic()
    server.stop()
    took = time.monotonic() - t0
    client.close()
    assert took < 1.2, f"stop took {took:.2f}s with grace 1"
    assert done.wait(5)


@pytest.mark.timeout(60)
def test_sigterm_during_the_heaviest_request_exits_within_the_grace():
    proc, address = start_serve("--backend", "none", "--grace", "3")
    try:
        with Client(address, timeout=None) as client:
            args, cluster = a2a(1024)
            call = threading.Thread(target=lambda: _quietly(client.estimate, *args,
                                                            cluster=cluster, timeout=None),
                                    daemon=True)
            call.start()
            time.sleep(1.0)
            t0 = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            proc.communicate(timeout=30)
            took = time.monotonic() - t0
        assert proc.returncode == 0
        # the stop holds the grace (it was 1 s over with a Runtime); the process's own
        # exit after it takes a few tenths more
        assert took < 4.0, f"exit took {took:.1f}s with --grace 3"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _quietly(fn, *args, **kwargs) -> None:
    with contextlib.suppress(ServiceError):
        fn(*args, **kwargs)


@pytest.mark.timeout(120)
def test_service_soak_reports_the_good_clients_latency():
    """The soak benchmark runs its hostile mix and reports every number it promises."""
    from reshard.microbench.service_soak import soak

    r = soak(seconds=2.0, hostile=3, devices=512, deadline=1.0)
    assert r["good_requests"] > 0 and r["good_p99_ms"] >= r["good_p50_ms"] > 0
    assert sum(r["hostile"].values()) >= 3 and r["server_peak_rss_mb"] > 0
    assert set(r["hostile"]) <= {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}


def padded_estimate(n: int, pad: int) -> bytes:
    """The bytes of an n -> n all-to-all Estimate request with ``pad`` bytes of an
    unknown field (valid protobuf: the server must parse and ignore it)."""
    from reshard.microbench.service_soak import varint
    from reshard.service.convert import request_to_pb

    (shape, dtype, src, dst), cluster = a2a(n)
    raw = request_to_pb([(shape, dtype, src, dst, None)], cluster, "broadcast").SerializeToString()
    return raw + varint((1000 << 3) | 2) + varint(pad) + b"\0" * pad


@pytest.mark.timeout(90)
def test_request_bytes_in_flight_are_capped():
    """While one 2.5 MiB request is being worked on (counted as 7.5 MiB of memory), a
    second one would bring that to 15 MiB, over a 9 MiB budget: refused before parsing; once the first ends its bytes
    are given back and the second is served. Bytes that are no message are
    INVALID_ARGUMENT."""
    options = ServeOptions(port=0, backend=None, job_workers=1, max_message_bytes=3 * MIB,
                           max_inline_bytes=2 * MIB, max_inflight_bytes=9 * MIB)
    with Server(options).start() as server:
        channel = grpc.insecure_channel(server.address, options=[
            ("grpc.max_send_message_length", 3 * MIB)])
        call = channel.unary_unary("/reshard.v1.Reshard/Estimate")
        heavy, small = padded_estimate(1024, 5 << 19), padded_estimate(16, 5 << 19)
        failed: list[grpc.RpcError] = []

        def hold() -> None:
            try:
                call(heavy, timeout=3.0)
            except grpc.RpcError as e:
                failed.append(e)

        t = threading.Thread(target=hold)
        t.start()
        deadline = time.monotonic() + 10
        while server.inflight.held == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.inflight.held >= 3 * (5 << 19)
        with pytest.raises(grpc.RpcError) as e:
            call(small, timeout=10)
        assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-inflight-bytes" in e.value.details()
        t.join()
        assert failed and failed[0].code() is grpc.StatusCode.DEADLINE_EXCEEDED
        deadline = time.monotonic() + 2  # the handler ends just after the caller's deadline
        while server.inflight.held and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.inflight.held == 0
        cost = call(small, timeout=10)
        assert cost  # an encoded Cost
        with pytest.raises(grpc.RpcError) as e:
            call(b"\xff\xff\xff", timeout=10)
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid PlanRequest" in e.value.details()
        channel.close()


@pytest.mark.timeout(120)
def test_service_flood_reports_the_servers_memory():
    """The flood benchmark serves every distinct padded request (retrying refusals for
    the bytes in flight) and reports the server's memory next to its budgets."""
    from reshard.microbench.service_soak import flood

    r = flood(requests=8, request_mb=4.0, clients=2)
    assert r["outcomes"].get("OK") == 8
    assert set(r["outcomes"]) <= {"OK", "RESOURCE_EXHAUSTED"}
    assert r["rss_peak_mb"] >= r["rss_after_mb"] > 0 and r["rss_before_mb"] > 0
    assert r["budget_mb"] == 2 * 128 + 64 + 256


@pytest.mark.timeout(120)
def test_the_plan_cache_weighs_what_a_request_makes_it_hold():
    """Ten valid Estimates whose clusters have 8 MiB names: the plan cache (32 MiB)
    keeps what fits, weighed with each plan's cluster, where it kept all ten almost free
    (each name +8 MiB of server memory: the audit's 30 MiB names OOM-killed a server at
    the 123rd)."""
    import dataclasses

    options = ServeOptions(port=0, backend=None, job_workers=1, plan_cache_bytes=32 * MIB)
    src = Layout(DeviceMesh((2,)), "S0R")
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "S0R")
    with Server(options).start() as server, Client(server.address, timeout=30) as client:
        for k in range(10):
            named = dataclasses.replace(Cluster.regular(2, 2), name=f"{k}" + "x" * (8 << 20))
            client.estimate((64, 8), "float32", src, dst, cluster=named)
        plans = server.servicer.plans
        assert 1 <= len(plans) <= 3
        assert plans._weight <= plans.capacity


@pytest.mark.timeout(120)
def test_stop_is_bounded_by_its_grace_with_a_stopped_gloo_worker():
    """A gloo worker stopped (SIGSTOP) when the server stops with a 1 s grace: the stop
    holds the grace, the workers killed by then (the audit's took 8.5-8.9 s against a
    3 s grace; then 1-2.5 s over it: the launcher's terminate and kill, and its fork
    server's exit, came after the grace)."""
    pytest.importorskip("torch")
    options = ServeOptions(port=0, backend="gloo", launcher="process",
                           cluster=Cluster.regular(1, 2), job_workers=1, grace=1.0)
    server = Server(options).start()
    pids = list(server.host._runtime.group.pids.values())
    assert len(pids) == 2
    os.kill(pids[0], signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        server.stop()
        took = time.monotonic() - t0
        left = [pid for pid in pids if _alive(pid)]  # a killed one is a zombie at most
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert took < 1.2, f"stop took {took:.2f}s against a 1 s grace"
    assert not left, f"workers {left} outlived the stop"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def s0(n: int) -> tuple[tuple, Cluster]:
    """An n -> n S0 -> S0 move between two halves of n / 4 hosts of 8: few cells (2 n),
    but its lower bound's decomposition grows faster than linearly in n."""
    cluster = Cluster.preset("dgx-h100", n // 4)
    src = Layout(DeviceMesh((n,)), "S0R")
    dst = Layout(DeviceMesh((n,), devices=range(n, 2 * n)), "S0R")
    return ((4 * n, 64), "float32", src, dst), cluster


@pytest.mark.timeout(60)
def test_a_request_naming_too_many_devices_is_refused_at_once(served):
    _, client = served
    args, cluster = s0(32768)  # 65,536 devices: never answered within 300 s before
    t0 = time.monotonic()
    with pytest.raises(ServiceError, match=r"names 65536 devices .*budget of 16384 "
                                           r"\(--max-devices\)") as e:
        client.estimate(*args, cluster=cluster, timeout=30)
    assert e.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert time.monotonic() - t0 < 2.0


@pytest.mark.timeout(60)
def test_a_request_of_too_many_tensors_is_refused_before_it_is_sized():
    options = ServeOptions(port=0, backend=None, job_workers=1, max_tensors=1000)
    src = Layout(DeviceMesh((2,)), "S0")
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "S0")
    many = [((8,), "float32", src, dst)] * 20_000
    with Server(options).start() as server, Client(server.address, timeout=60) as client:
        t0 = time.monotonic()
        with pytest.raises(ServiceError, match=r"more than 1000 tensors \(counted before "
                                               r"parsing\), over the server's budget of 1000 "
                                               r"\(--max-tensors\)") as e:
            client.plan_many(many, timeout=30)
        assert e.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        # the client's encoding of 20,000 tensors is most of it (~2 s, more under load);
        # the server's count on the wire takes under a millisecond
        assert time.monotonic() - t0 < 15.0


@pytest.mark.timeout(120)
def test_many_device_estimates_run_in_workers_and_small_calls_keep_flowing():
    """Four threads sending 2,048-device S0 -> S0 Estimates (4,096 cells: once sized as
    cheap and costed on the serving threads, ~2 s of CPU each) for 6 s: they run in the
    job workers (or are refused busy), and a well-behaved client's small Estimates keep
    a p99 under 1 s (13 of 14 timed out in the audit)."""
    options = ServeOptions(port=0, backend=None, job_workers=1)
    stop = threading.Event()
    refused: list[str] = []
    with Server(options).start() as server:
        def hammer() -> None:
            with Client(server.address, timeout=30) as c:
                args, cluster = s0(2048)
                while not stop.is_set():
                    try:
                        c.estimate(*args, cluster=cluster, timeout=10)
                    except ServiceError as e:
                        refused.append(str(e))

        threads = [threading.Thread(target=hammer, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        src = Layout(DeviceMesh((2, 2)), "S0R")
        dst = Layout(DeviceMesh((4,), devices=range(4, 8)), "RS0")
        latencies = []
        with Client(server.address, timeout=30) as good:
            t0 = time.monotonic()
            k = 0
            while time.monotonic() - t0 < 6.0:
                s = time.monotonic()
                good.estimate((64 + k, 32), "float32", src, dst, timeout=5)  # new each time
                latencies.append(time.monotonic() - s)
                k += 1
        stop.set()
        for t in threads:
            t.join(30)
    assert any("busy" in r for r in refused)  # the big ones went to the pool
    p99 = statistics.quantiles(latencies, n=100)[98]
    assert p99 < 1.0, f"small calls waited: p99 {p99:.3f}s over {len(latencies)} calls"

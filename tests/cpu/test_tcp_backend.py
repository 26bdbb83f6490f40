"""The tcp and nixl backends' operations against the reference semantics (the tests
that hold for any host-memory plane run on both; the rest are tcp's own, and nixl's own
are in test_nixl_backend.py): ranks on threads of
this process (neither needs a process of its own), every dtype through broadcast / send /
recv / all-gather / reduce, pipelined chains and trees in several frames, groups with
relays of two chains at once, scattered and gathered buffers cut differently on the two
sides, channels on threads of their own, and failures that name the peer. Then an
executor on tcp ranks: a coalesced message's payloads that are contiguous in their
shards move straight from and into them (their scratch bytes never written)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from reshard import Cluster
from reshard.comm.backends.nixl import NixlBackend, available
from reshard.comm.backends.tcp import TcpBackend
from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer
from reshard.comm.executor import Executor
from reshard.errors import ExecutionError
from reshard.microbench.small_tensors import requests
from reshard.planner.plan import plan_many

pytestmark = pytest.mark.cpu

WORLD = (0, 3, 5)  # sparse device ids
DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128", "bfloat16",
          "float8_e4m3fn")


def _values(device: int, dtype: str, n: int = 5) -> np.ndarray:
    from reshard.dtypes import parse_dtype

    dt = parse_dtype(dtype)
    base = np.arange(n) * 37 + device * 101  # wraps for narrow types: sums must too
    if dt.kind in "iu":
        return base.astype(np.int64).astype(dt)
    out = (base % 7).astype(np.float32).astype(dt)
    if dt.kind == "c":
        out = out + 1j * dt.type(device)
    return out


PLANES = ["tcp", pytest.param("nixl", marks=pytest.mark.skipif(
    available() is not None, reason="the nixl extra is not installed"))]
"""The planes the shared tests run on."""
_FACTORY: dict[str, Any] = {"tcp": TcpBackend, "nixl": NixlBackend}


def _ranks(fn: Callable[[Any], Any], world=WORLD, timeout: float = 20.0,
           join: float = 60.0, plane: str = "tcp") -> dict[int, Any]:
    """``fn(rank)`` on one thread per device of ``world`` (ranks of ``plane``); each
    result, or the exception it raised. The ranks are closed afterwards."""
    server = TcpRendezvousServer()
    out: dict[int, Any] = {}

    def run(d: int) -> None:
        b = None
        try:
            b = _FACTORY[plane](d, world, server.address.connect(10), timeout)
            out[d] = fn(b)
        except BaseException as e:  # noqa: BLE001 - returned to the test
            out[d] = e
        finally:
            if b is not None:
                b.close()

    threads = [threading.Thread(target=run, args=(d,), daemon=True) for d in world]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(join)
        assert not any(t.is_alive() for t in threads), "a rank hung"
    finally:
        server.close()
    return out


def _ok(results: dict[int, Any]) -> dict[int, Any]:
    failed = {d: r for d, r in results.items() if isinstance(r, BaseException)}
    assert not failed, f"ranks failed: {failed}"
    return results


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plane", PLANES)
def test_tcp_ops_match_reference_semantics(plane):
    def body(b: TcpBackend) -> dict:
        d, out = b.device, {}
        for dt in DTYPES:
            buf = _values(d, dt) if d == 5 else np.zeros_like(_values(d, dt))
            b.broadcast(buf, 5, WORLD)
            out[("bcast", dt)] = buf
            if d in (0, 5):
                rows = np.zeros((2, 5), _values(d, dt).dtype)
                b.all_gather(rows, _values(d, dt), (0, 5))
                out[("gather", dt)] = rows
            if dt not in ("bfloat16", "float8_e4m3fn"):  # sums run in accumulators
                red = _values(d, dt)
                b.reduce(red, 0, WORLD)
                out[("reduce", dt)] = red
        from reshard.dtypes import ReduceOp

        top = np.array([d, -d, 7], np.float32)
        b.reduce(top, 3, WORLD, op=ReduceOp.MAX)
        out["max"] = top
        if d == 3:
            b.send(np.arange(7, dtype=np.int64), 5, tag=4)
        if d == 5:
            got = np.zeros(7, np.int64)
            b.recv(got, 3, tag=4)
            out["p2p"] = got
        b.barrier(WORLD)
        b.broadcast(np.zeros(0, np.float32), 0, WORLD)  # zero bytes: a no-op everywhere
        return out

    got = _ok(_ranks(body, plane=plane))
    for dt in DTYPES:
        for d in WORLD:
            assert got[d][("bcast", dt)].tobytes() == _values(5, dt).tobytes(), dt
        for d in (0, 5):
            want = np.stack([_values(0, dt), _values(5, dt)])
            assert got[d][("gather", dt)].tobytes() == want.tobytes(), dt
        if dt not in ("bfloat16", "float8_e4m3fn"):
            want = _values(0, dt) + _values(3, dt) + _values(5, dt)  # numpy wraps alike
            assert got[0][("reduce", dt)].tobytes() == want.tobytes(), dt
    assert got[3]["max"].tolist() == [5.0, 0.0, 7.0]
    assert got[5]["p2p"].tolist() == list(range(7))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plane", PLANES)
def test_chains_trees_and_gathered_buffers_in_many_frames(plane):
    n = 3 * 4096 // 8 + 5  # several 4 KiB frames and a ragged last one

    def body(b: TcpBackend) -> dict:
        d, out = b.device, {}
        b.use_piece(4096)
        value = np.arange(n, dtype=np.float64)
        # two chains in one group whose relays are each other's leaves: 5 -> 0 -> 3
        # and 3 -> 0 -> 5; and a tree 0 -> {3, 5}; each relay passes frames on as they land
        a = value.copy() if d == 5 else np.zeros(n)
        c = -value if d == 3 else np.zeros(n)
        t = value * 2 if d == 0 else np.zeros(n)
        seen: list[int] = []
        b.group_start()
        b.broadcast(a, 5, WORLD, chain=(0, 3), tag=1,
                    landed=seen.append if d == 3 else None)
        b.broadcast(c, 3, WORLD, chain=(0, 5), tag=2)
        b.broadcast(t, 0, WORLD, chain=(3, 5), parents=(0, 0), tag=3)
        b.group_end()
        out.update(a=a, c=c, t=t, seen=seen)
        # gathered at the sender from three arrays of different dtypes, scattered at
        # the receiver into two cut elsewhere; the bytes arrive as one stream
        parts = [np.arange(5, dtype=np.int64), np.arange(3, dtype=np.float32),
                 np.arange(9000, dtype=np.uint8)]
        total = sum(p.nbytes for p in parts)
        if d == 3:
            b.send(parts, 5, tag=9)
        if d == 5:
            into = [np.zeros(17, np.uint8), np.zeros(total - 17, np.uint8)]
            landed: list[int] = []
            b.recv(into, 3, tag=9, landed=landed.append)
            out["gathered"] = (b"".join(x.tobytes() for x in into), landed)
            out["want"] = b"".join(p.tobytes() for p in parts)
        return out

    got = _ok(_ranks(body, plane=plane))
    value = np.arange(n, dtype=np.float64)
    for d in WORLD:
        assert got[d]["a"].tolist() == value.tolist()
        assert got[d]["c"].tolist() == (-value).tolist()
        assert got[d]["t"].tolist() == (value * 2).tolist()
    seen = got[3]["seen"]
    assert len(seen) == 4 and seen == sorted(seen) and seen[-1] == n * 8  # per frame
    data, landed = got[5]["gathered"]
    assert data == got[5]["want"]
    assert landed == sorted(landed) and landed[-1] == len(data) and len(landed) == 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plane", PLANES)
def test_channels_run_concurrently_on_their_own_connections(plane):
    def body(b: TcpBackend) -> dict:
        out: dict = {}
        chans = {name: b.channel(name) for name in ("a", "b")}

        def run(name: str, ch: TcpBackend) -> None:
            k = ord(name)
            for r in range(20):
                buf = np.full(1000, k + r, np.int32) if ch.device == 0 else \
                    np.zeros(1000, np.int32)
                ch.broadcast(buf, 0, WORLD)
                out[(name, r)] = int(buf.sum())

        threads = [threading.Thread(target=run, args=item) for item in chans.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for ch in chans.values():
            ch.close()
        return out

    got = _ok(_ranks(body, plane=plane))
    for d in WORLD:
        for name in ("a", "b"):
            assert [got[d][(name, r)] for r in range(20)] == \
                [1000 * (ord(name) + r) for r in range(20)]


@pytest.mark.timeout(60)
def test_a_peer_that_closes_fails_the_receive_at_once_naming_it():
    def body(b: TcpBackend) -> Any:
        if b.device == 5:
            b.send(np.zeros(1, np.uint8), 3)  # connected, then gone
            b.close()
            return None
        if b.device == 3:
            b.recv(np.zeros(1, np.uint8), 5)
            t0 = time.monotonic()
            with pytest.raises(ExecutionError, match=r"device 5 closed the connection"):
                b.recv(np.zeros(8, np.uint8), 5)
            return time.monotonic() - t0
        return None

    got = _ok(_ranks(body, timeout=30))
    assert got[3] < 10  # the closed connection, not the 30 s timeout


@pytest.mark.timeout(60)
def test_a_silent_peer_times_out_naming_it():
    def body(b: TcpBackend) -> Any:
        if b.device == 0:
            b.send(np.zeros(1, np.uint8), 3)
            time.sleep(2.5)  # connected, never sends what 3 waits for
            return None
        if b.device == 3:
            b.recv(np.zeros(1, np.uint8), 0)
            with pytest.raises(ExecutionError,
                               match=r"no progress receiving from device\(s\) \[0\] within 1s"):
                b.recv(np.zeros(8, np.uint8), 0, tag=1)
        return None

    _ok(_ranks(body, timeout=1.0))


@pytest.mark.timeout(60)
def test_a_receive_of_another_size_is_refused_and_the_channel_with_it():
    """Sizes are compared at the first frame, also where the frames would fit (two
    4 KiB frames into a 4 KiB receive and the next one of the same tag); the channel
    refuses every later operation, naming the first failure."""
    sent = threading.Event()

    def body(b: TcpBackend) -> Any:
        b.use_piece(4096)
        if b.device == 0:
            b.send(np.zeros(100, np.uint8), 3, tag=2)
            b.send(np.zeros(8192, np.uint8), 3, tag=5)
            sent.set()
        if b.device == 3:
            with pytest.raises(ExecutionError, match=r"sends 100 bytes .* where 50 are "
                                                     r"expected .* different plans"):
                b.recv(np.zeros(50, np.uint8), 0, tag=2)
            with pytest.raises(ExecutionError, match=r"failed earlier .*sends 100 bytes"):
                b.recv(np.zeros(4096, np.uint8), 0, tag=5)
            sent.wait(10)  # closing with 0's bytes unsent would reset its connection
        if b.device == 5:  # a fresh pair: 8192 bytes sent as 4 KiB frames, 4096 expected
            b.send(np.zeros(8192, np.uint8), 0, tag=7)
        if b.device == 0:
            with pytest.raises(ExecutionError, match=r"sends 8192 bytes .* where 4096"):
                b.recv(np.zeros(4096, np.uint8), 5, tag=7)
        return None

    _ok(_ranks(body, timeout=5.0))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("plane", PLANES)
def test_more_parts_than_one_system_call_takes_and_members_outside_a_broadcast(plane):
    def body(b: TcpBackend) -> Any:
        out = {}
        if b.device == 0:  # 1,500 parts of 3 bytes: two sendmsg calls' worth of iovecs
            b.send([np.full(3, k % 251, np.uint8) for k in range(1500)], 5)
            into = [np.zeros(5, np.uint8) for _ in range(1300)]
            b.recv(into, 5)
            out["scattered"] = np.concatenate(into)
        if b.device == 5:
            got = np.zeros(4500, np.uint8)
            b.recv(got, 0)
            out["gathered"] = got
            b.send(np.arange(6500, dtype=np.uint8), 0)
        buf = np.ones(4, np.int32) * (b.device == 3)
        b.broadcast(buf, 3, (3, 5))  # device 0 is not a member: nothing to do
        out["bcast"] = buf.tolist()
        return out

    got = _ok(_ranks(body, plane=plane))
    want = np.concatenate([np.full(3, k % 251, np.uint8) for k in range(1500)])
    assert got[5]["gathered"].tobytes() == want.tobytes()
    assert got[0]["scattered"].tobytes() == np.arange(6500, dtype=np.uint8).tobytes()
    assert got[5]["bcast"] == [1, 1, 1, 1] and got[0]["bcast"] == [0, 0, 0, 0]


@pytest.mark.timeout(60)
def test_a_connection_without_the_secret_is_dropped():
    addresses: dict[int, tuple[str, int]] = {}
    ready = threading.Event()

    def body(b: TcpBackend) -> Any:
        if b.device == 5:
            addresses[5] = b._hub.listener.getsockname()[:2]
            ready.set()
        ready.wait(10)
        if b.device == 0:  # an intruder connects first, claiming to be device 3
            from reshard.comm.backends import tcp_hub

            with socket.create_connection(addresses[5]) as s:
                s.recv(tcp_hub.CHALLENGE.size)  # answered without the secret: a wrong MAC
                s.sendall(tcp_hub.HELLO.pack(tcp_hub.MAGIC, bytes(32), 3, 0))
                time.sleep(0.3)
        b.barrier(WORLD)
        buf = np.arange(4.0) if b.device == 3 else np.zeros(4)
        b.broadcast(buf, 3, WORLD)
        return buf.tolist()

    got = _ok(_ranks(body))
    assert all(v == [0.0, 1.0, 2.0, 3.0] for v in got.values())


# ----- the executor on tcp ranks ---------------------------------------------------------
def _scratch_untouched(gathers: bool, plane: str) -> tuple[int, int, bool]:
    """Twenty small tensors (contiguous in their shards on one side, strided on the other)
    coalesced and run on 8 tcp ranks whose scratch starts as 0xAB; returns the message
    bytes, how many of them stayed 0xAB, and whether every destination was exact."""
    reqs = [(shape, "float32", src, dst) for shape, _, src, dst in
            requests(20, seed=3, low=8 << 10, high=16 << 10)]
    plan = plan_many(reqs, cluster=Cluster.regular(2, 4))
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(shape).astype(np.float32) for shape, *_ in reqs]
    world = tuple(range(8))

    def body(b: TcpBackend) -> tuple[int, int, bool]:
        caps = b.capabilities if gathers else replace(b.capabilities, gathers=False)
        ex = Executor(b, capabilities=caps)
        lp = ex.load(plan)
        lp.scratch[...] = 0xAB
        d = b.device
        src = [v[sl] if (sl := lay.index_map(v.shape).get(d)) is not None else None
               for v, (_, _, lay, _) in zip(values, reqs)]
        got = ex.run(lp, [None if s is None else np.ascontiguousarray(s) for s in src]).wait()
        exact = all(got[i].tobytes() == np.ascontiguousarray(v[dst.index_map(v.shape)[d]])
                    .tobytes() for i, (v, (*_, dst)) in enumerate(zip(values, reqs))
                    if d in dst.devices)
        total = kept = 0
        for step in lp.steps:
            for st in step:
                if st.message:
                    region = lp.scratch[st.message_at:st.message_at + st.message]
                    total += region.size
                    kept += int((region == 0xAB).sum())
        return total, kept, exact

    got = _ok(_ranks(body, world=world, plane=plane))
    return (sum(t for t, _, _ in got.values()), sum(k for _, k, _ in got.values()),
            all(e for *_, e in got.values()))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plane", PLANES)
def test_contiguous_payloads_of_a_message_skip_scratch_memory(plane):
    total, kept, exact = _scratch_untouched(gathers=True, plane=plane)
    assert exact and total
    # about half of each payload's copies skip scratch (a box is strided on one side);
    # a few bytes of a region may hold 0xAB by chance, far from half of them
    assert 0.25 * total < kept < 0.9 * total
    total_off, kept_off, exact_off = _scratch_untouched(gathers=False, plane=plane)
    assert exact_off and total_off == total
    assert kept_off < 0.02 * total  # without gathering every payload goes through scratch


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plane", PLANES)
def test_spmd_ranks_plan_for_themselves_and_agree_on_tcp(plane):
    """Executor.load_request on tcp ranks: every rank plans its own share, the digests
    are exchanged over tcp (an all-gather), and the reshard is exact."""
    from reshard import DeviceMesh, Layout

    src = Layout(DeviceMesh((2,), [0, 1]), "S0R")
    dst = Layout(DeviceMesh((2,), [2, 3]), "RS0")
    value = np.arange(64 * 48, dtype=np.float32).reshape(64, 48)
    world = (0, 1, 2, 3)

    def body(b: TcpBackend) -> bool:
        ex = Executor(b)
        lp, _ = ex.load_request([((64, 48), "float32", src, dst)], Cluster.regular(2, 2))
        d = b.device
        mine = src.index_map(value.shape).get(d)
        got = ex.run(lp, [None if mine is None else np.ascontiguousarray(value[mine])]).wait()
        want = dst.index_map(value.shape).get(d)
        return want is None or got[0].tobytes() == np.ascontiguousarray(value[want]).tobytes()

    assert all(_ok(_ranks(body, world=world, plane=plane)).values())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("plane", PLANES)
def test_executor_create_builds_tcp_ranks_by_name(plane):
    """The registry's ``tcp`` entry: Executor.create with the rendezvous alone."""
    import reshard
    from reshard import DeviceMesh, Layout

    server = TcpRendezvousServer()
    src = Layout(DeviceMesh((1,), [0]), "R")
    dst = Layout(DeviceMesh((1,), [1]), "R")
    plan = reshard.plan((300,), "int64", src, dst, cluster=Cluster.regular(2, 1))
    out: dict[int, Any] = {}

    def run(d: int) -> None:
        try:
            with Executor.create(plane, d, (0, 1), server.address.connect(10), 10.0) as ex:
                assert ex.capabilities.gathers and not ex.capabilities.groups_need_world
                got = ex.execute(plan, [np.arange(300) if d == 0 else None])
                out[d] = got.get(0)
        except BaseException as e:  # noqa: BLE001 - returned to the test
            out[d] = e

    threads = [threading.Thread(target=run, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    server.close()
    assert out[1].tolist() == list(range(300)), out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("plane", PLANES)
def test_a_frame_nobody_expects_yet_waits_for_its_receive(plane):
    """A relay's own message overtakes the one it relays (its frames go as soon as it
    issues them, the relayed ones as they arrive): the receiver, which posts the relayed
    one first, finds a header it does not expect yet; it waits (parked) and is read once
    its receive is posted."""
    def body(b: TcpBackend) -> Any:
        d = b.device
        relayed = np.arange(6, dtype=np.int64) if d == 0 else np.zeros(6, np.int64)
        own = np.full(4, 7, np.int32) if d == 3 else np.zeros(4, np.int32)
        b.all_gather(np.zeros((3, 1), np.uint8), np.zeros(1, np.uint8), WORLD)  # connected
        if d == 0:
            time.sleep(0.6)  # device 3's own message is on the wire long before
        if d == 5:
            time.sleep(0.3)  # and has arrived when 5 posts its first receive
        b.group_start()
        b.broadcast(relayed, 0, WORLD, chain=(3, 5), tag=1)  # 0 -> 3 -> 5
        if d == 3:
            b.send(own, 5, tag=2)
        if d == 5:
            b.recv(own, 3, tag=2)
        b.group_end()
        return relayed.tolist(), own.tolist()

    got = _ok(_ranks(body, timeout=10.0, plane=plane))
    assert got[5] == (list(range(6)), [7] * 4)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("plane", PLANES)
def test_reductions_run_down_a_chain_in_frames(plane):
    """A reduction of several 4 KiB frames, its root in the middle of the group: the
    sum (integers wrapping) and the max, exact at the root."""
    from reshard.dtypes import ReduceOp

    n = 5000  # 20,000 bytes of int32: five frames, the last one short

    def body(b: TcpBackend) -> dict:
        b.use_piece(4096)
        d = b.device
        total = (np.arange(n, dtype=np.int64) * (d + 1) * 700_000_000).astype(np.int32)
        b.reduce(total, 3, WORLD)
        top = np.where(np.arange(n) % 3 == WORLD.index(d), d, -1).astype(np.float32)
        b.reduce(top, 3, WORLD, op=ReduceOp.MAX)
        return {"sum": total, "max": top}

    got = _ok(_ranks(body, plane=plane))
    want = sum((np.arange(n, dtype=np.int64) * (d + 1) * 700_000_000).astype(np.int32)
               for d in WORLD)  # numpy's int32 sum wraps like the ranks' does
    assert got[3]["sum"].tobytes() == want.astype(np.int32).tobytes()
    assert got[3]["max"].tolist() == [float(WORLD[k % 3]) for k in range(n)]

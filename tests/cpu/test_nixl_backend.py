"""The nixl backend's own behaviour (the operations it shares with tcp run in
test_tcp_backend.py): WRITEs land only in the destination places (guard bytes around
every box stay), each array is registered once however often it moves, a send goes in
pieces only to a receiver that acts on them, and the faults
name the device: a silent peer, metadata published for a device by another agent, a
notification from an agent outside the run, a receive of another size. Ranks on threads
of this process."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from reshard.comm.backends.nixl import NixlBackend, agent_prefix, available
from reshard.comm.backends.nixl_memory import POOL_ENV
from reshard.errors import ExecutionError

from .test_tcp_backend import WORLD, _ok, _ranks

pytestmark = [pytest.mark.cpu,
              pytest.mark.skipif(available() is not None,
                                 reason="the nixl extra is not installed")]


@pytest.mark.timeout(120)
def test_writes_touch_only_the_boxes_and_register_each_array_once():
    """Device 0 sends eight boxes, gathered from rows of one array, to device 5, which
    scatters them into eight places of one array with guard bytes between them; ten
    rounds. Every guard byte stays, and each side registered its array once."""
    rows, cols = 8, 1000

    def body(b: NixlBackend) -> Any:
        b.use_piece(4096)
        d = b.device
        if d == 0:
            src = np.arange(rows * cols, dtype=np.int32).reshape(rows, cols)
            for _ in range(10):
                b.send([src[r] for r in range(rows)], 5, tag=3)
            return b.registrations.registered
        if d == 5:
            dst = np.full((rows, cols + 16), -7, np.int32)  # 16 guard ints per row
            for _ in range(10):
                b.recv([dst[r, 8:8 + cols] for r in range(rows)], 0, tag=3)
            return dst, b.registrations.registered
        return None

    got = _ok(_ranks(body, plane="nixl"))
    dst, registered = got[5]
    want = np.arange(rows * cols, dtype=np.int32).reshape(rows, cols)
    assert dst[:, 8:8 + cols].tobytes() == want.tobytes()
    assert (dst[:, :8] == -7).all() and (dst[:, 8 + cols:] == -7).all()
    assert registered == 1 and got[0] == 1  # the arrays themselves, once each


@pytest.mark.timeout(120)
def test_pieces_go_one_by_one_only_where_the_receiver_acts_on_them():
    """Device 0 sends 64 KiB in 4 KiB pieces to device 5 twice: to a receive that
    hears of every piece (``landed``), then to a plain one. The first lands in 16
    WRITEs, each heard of as it lands; the second in one. Both exact."""
    n = 64 << 10

    def body(b: NixlBackend) -> Any:
        b.use_piece(4096)
        if b.device == 0:
            src = np.arange(n, dtype=np.uint8)
            agent = b._shared.agent
            real, writes = agent.initialize_xfer, []

            def counted(*args: Any, **kw: Any) -> Any:
                writes.append(args[0])
                return real(*args, **kw)

            agent.initialize_xfer = counted
            try:
                b.send(src, 5, tag=1)
                first = len(writes)
                b.send(src, 5, tag=1)
            finally:
                agent.initialize_xfer = real
            return first, len(writes) - first
        if b.device == 5:
            heard: list[int] = []
            piecewise, whole = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
            b.recv(piecewise, 0, tag=1, landed=heard.append)
            b.recv(whole, 0, tag=1)
            return heard, piecewise, whole
        return None

    got = _ok(_ranks(body, plane="nixl"))
    heard, piecewise, whole = got[5]
    want = np.arange(n, dtype=np.uint8)
    assert piecewise.tobytes() == want.tobytes() and whole.tobytes() == want.tobytes()
    assert got[0] == (16, 1)
    assert len(heard) == 16 and heard[-1] == n and heard == sorted(heard)


@pytest.mark.timeout(120)
def test_memory_deregistered_and_reused_lands_in_staging_never_under_stale_keys():
    """Device 5 receives 40 rounds into fresh arrays (one, then a message of four
    parts), holding at most 3 registered: older ones are deregistered and their memory
    reused by later arrays, where device 0 still holds the old keys (NIXL forgets a
    peer's keys only by disconnecting, which loses what is in flight). Those receives
    land in a staging buffer and are copied into place; device 0 is told which
    registrations went and forgets them, so neither side's records grow with the
    rounds. Every round exact, every part in its place."""
    sizes = [4096, 8192, 12288]

    def body(b: NixlBackend) -> Any:
        b.registrations.limit = 3
        if b.device == 0:
            for k in range(40):
                b.send(np.full(sizes[k % 3], k % 251, np.uint8), 5, tag=1)
                b.send([np.full(300, (k + j) % 251, np.uint8) for j in range(4)], 5, tag=2)
            return len(b._shared.known[5])
        if b.device == 5:
            wrong = 0
            for k in range(40):
                dst = np.zeros(sizes[k % 3], np.uint8)
                b.recv(dst, 0, tag=1)
                wrong += int((dst != k % 251).sum())
                parts = [np.zeros(300, np.uint8) for _ in range(4)]
                b.recv(parts, 0, tag=2)
                wrong += sum(int((x != (k + j) % 251).sum()) for j, x in enumerate(parts))
                del dst, parts
            mem = b.registrations
            return wrong, mem.trimmed, mem.held, mem.staged, len(b._shared.seen[0])
        return None

    got = _ok(_ranks(body, plane="nixl"))
    wrong, trimmed, held, staged, seen = got[5]
    assert wrong == 0
    assert trimmed > 0 and held <= 3 + 1  # and the staging buffer, registered for good
    assert staged > 0
    # what each side records of the other is bounded by the registrations held
    assert seen <= held and got[0] <= held + 2


@pytest.mark.timeout(180)
def test_many_small_receives_over_deregistered_memory_between_processes(monkeypatch):
    """The plan of 600 small tensors, coalesced, run 9 times between four pairs of
    worker processes (UCX on TCP, as on the testbed), with no pool (every buffer
    registered on its own, as a caller's arrays are): each receiver registers 600 fresh
    arrays a run, past its 4,096 and into memory its peer was told of before. Every
    run completes, every shard exact. (Reloading a peer's whole metadata instead
    disconnected the two agents while notifications were in flight: a ready was lost
    and both sides waited out the timeout.) With the pool, the same runs register one
    slab a receiver."""
    import reshard
    from reshard import Cluster, DeviceMesh, Layout

    here = Layout(DeviceMesh((4,), devices=[0, 1, 2, 3]), "S0R")
    there = Layout(DeviceMesh((4,), devices=[4, 5, 6, 7]), "S0R")
    rng = np.random.default_rng(0)
    values = [rng.integers(0, 255, (4, 256), dtype=np.uint8) for _ in range(600)]
    plan = reshard.plan_many([((4, 256), "uint8", here, there)] * 600,
                             cluster=Cluster.regular(4, 2))
    monkeypatch.setenv("UCX_TLS", "tcp")
    for pool, runs in (("0", 9), (None, 3)):
        if pool is None:
            monkeypatch.delenv(POOL_ENV, raising=False)
        else:
            monkeypatch.setenv(POOL_ENV, pool)
        with reshard.Runtime("nixl", Cluster.regular(4, 2), "process", timeout=60) as rt:
            xs = [rt.put(v, here) for v in values]
            for _ in range(runs):
                ys = rt.execute(plan, xs)
                wrong = [i for i, (y, v) in enumerate(zip(ys, values))
                         if not np.array_equal(rt.get(y), v)]
                assert not wrong, f"{len(wrong)} tensors differ, the first {wrong[:5]}"
                rt.free(*ys)


@pytest.mark.timeout(60)
def test_a_silent_peer_times_out_naming_it():
    def body(b: NixlBackend) -> Any:
        if b.device == 0:
            time.sleep(2.5)  # never sends what 3 waits for
            return None
        if b.device == 3:
            t0 = time.monotonic()
            with pytest.raises(ExecutionError, match=r"no progress waiting for bytes from "
                                                     r"device\(s\) \[0\] within 1s"):
                b.recv(np.zeros(8, np.uint8), 0, tag=1)
            return time.monotonic() - t0
        return None

    got = _ok(_ranks(body, timeout=1.0, plane="nixl"))
    assert got[3] < 5


@pytest.mark.timeout(60)
def test_a_receive_of_another_size_is_refused_naming_both():
    def body(b: NixlBackend) -> Any:
        if b.device == 0:
            with pytest.raises(ExecutionError, match=r"device 3 receives 50 bytes .* "
                                                     r"where this rank sends 100"):
                b.send(np.zeros(100, np.uint8), 3, tag=2)
            with pytest.raises(ExecutionError, match="failed earlier"):
                b.send(np.zeros(1, np.uint8), 3)  # the channel is refused from then on
        if b.device == 3:
            with pytest.raises(ExecutionError, match=r"waiting for bytes from device\(s\) \[0\]"):
                b.recv(np.zeros(50, np.uint8), 0, tag=2)
        return None

    _ok(_ranks(body, timeout=3.0, plane="nixl"))


@pytest.mark.timeout(60)
def test_metadata_and_notifications_of_other_agents_are_refused():
    """An impostor agent publishes its metadata as device 3's: device 0 refuses it,
    naming the device and the agent. Another impostor, outside the run, notifies
    device 5: refused, naming that agent."""
    from nixl._api import nixl_agent, nixl_agent_config

    from reshard.comm.rendezvous import TcpRendezvousServer

    server = TcpRendezvousServer()
    config = nixl_agent_config(enable_prog_thread=True, backends=["UCX"])
    impostor = nixl_agent("someone-else", config)
    outsider = nixl_agent(agent_prefix(9) + "000000000000", config)
    try:
        server.address.connect(10).set("nixl/3", bytes(impostor.get_agent_metadata()))
        zero = NixlBackend(0, WORLD, server.address.connect(10), 2.0)
        five = NixlBackend(5, WORLD, server.address.connect(10), 2.0)
        try:
            with pytest.raises(ExecutionError, match=r"device 0: nixl metadata published for "
                                                     r"device 3 names agent 'someone-else'"):
                zero.send(np.zeros(4, np.uint8), 3)
            outsider.add_remote_agent(server.address.connect(10).get("nixl/5", 5.0))
            outsider.send_notif(five._shared.name, b"R" + bytes(64))
            with pytest.raises(ExecutionError, match=r"notification from agent "
                                                     r"'reshard-9-0+', which is no device's"):
                five.recv(np.zeros(4, np.uint8), 0)
        finally:
            zero.close()
            five.close()
    finally:
        server.close()

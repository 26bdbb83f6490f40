"""The nixl backend's own behaviour (the operations it shares with tcp run in
test_tcp_backend.py): WRITEs land only in the destination places (guard bytes around
every box stay), each array is registered once however often it moves, a send goes in
pieces only to a receiver that acts on them, and the faults
name the device: a silent peer, metadata published for a device by another agent, a
notification from an agent outside the run, a receive of another size. Ranks on threads
of this process."""

from __future__ import annotations

import re
import threading
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

    from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer

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


# ----- issue 61, item 11: forged agents, lost notifications, a dead peer ------------------
def _keyed(world: tuple[int, ...], server: Any, key: Any, timeout: float = 5.0
           ) -> dict[int, NixlBackend]:
    """Ranks of ``world`` (this process) sharing the run's link key."""
    return {d: NixlBackend(d, world, server.address.connect(10), timeout, link_key=key)
            for d in world}


@pytest.mark.timeout(60)
def test_metadata_forged_in_a_worker_s_name_is_refused():
    """A writer of the rendezvous replaces device 3's metadata with its own agent's,
    named as device 3's would be (``reshard-3-...``): the name check let it through
    (device 0 would then have told it where to write); with the run's key the
    metadata is unsigned, refused naming the device."""
    from nixl._api import nixl_agent, nixl_agent_config

    from reshard.comm.bootstrap.link_key import LinkKey
    from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer

    server = TcpRendezvousServer()
    ranks = _keyed((0, 3), server, LinkKey.new())
    impostor = nixl_agent(agent_prefix(3) + "0123456789ab",
                          nixl_agent_config(enable_prog_thread=True, backends=["UCX"]))
    try:
        server.address.connect(10).set("nixl/3", bytes(impostor.get_agent_metadata()))
        with pytest.raises(ExecutionError, match=r"device 0: nixl metadata published for "
                                                 r"device 3 is not signed with the run's key"):
            ranks[0].send(np.zeros(4, np.uint8), 3)
    finally:
        for b in ranks.values():
            b.close()
        server.close()


@pytest.mark.timeout(60)
def test_a_notification_from_an_agent_that_took_a_worker_s_name_is_refused():
    """A reader of the rendezvous learns device 3's agent name from its metadata, makes
    an agent of that name and tells device 0 the bytes it waits for have landed. Before,
    device 0's receive completed with bytes that never came (reported as success); now
    the notification carries no tag made with the run's key: refused, naming both."""
    from nixl._api import nixl_agent, nixl_agent_config

    from reshard.comm.backends.nixl_agent import HEAD, LANDED, RANGE
    from reshard.comm.bootstrap.link_key import LinkKey
    from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer

    server = TcpRendezvousServer()
    ranks = _keyed((0, 3), server, LinkKey.new())
    zero, three = ranks[0], ranks[3]
    zero._shared.load(0, 3)
    impostor = nixl_agent(three._shared.name,
                          nixl_agent_config(enable_prog_thread=True, backends=["UCX"]))
    impostor.add_remote_agent(server.address.connect(10).get("nixl/0", 5.0)[32:])
    buf = np.full(16, 7, np.uint8)
    out: dict = {}

    def receive() -> None:
        try:
            zero.recv(buf, 3, tag=1)
            out["done"] = buf.tolist()
        except ExecutionError as e:
            out["error"] = e

    t = threading.Thread(target=receive, daemon=True)
    try:
        t.start()
        time.sleep(0.5)
        impostor.send_notif(zero._shared.name,
                            HEAD.pack(LANDED, 0, 1, 0) + RANGE.pack(0, 16) + bytes(16))
        t.join(20)
        assert "error" in out, out  # not "done" with bytes nobody wrote
        assert re.search(r"device 0: nixl notification from agent 'reshard-3-\w+' \(device "
                         r"3's name\) does not carry the run's key", str(out["error"])), out
    finally:
        for b in ranks.values():
            b.close()
        server.close()


@pytest.mark.timeout(60)
def test_a_notification_that_never_arrives_names_the_peer_and_the_task():
    """Device 0's WRITE lands but its *landed* notification goes astray (here: sent
    for a channel device 3 has not opened): device 3's executor fails at its timeout,
    naming the task and the peer it waited on, instead of waiting for ever."""
    from reshard import Cluster, DeviceMesh, Layout
    from reshard.comm.bootstrap.link_key import LinkKey
    from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer
    from reshard.comm.executor import Executor
    from reshard.planner.plan import plan

    src = Layout(DeviceMesh((1,), [0]), "RR")
    dst = Layout(DeviceMesh((1,), [3]), "RR")
    value = np.arange(64, dtype=np.float32).reshape(8, 8)
    p = plan(value.shape, "float32", src, dst, cluster=Cluster.regular(1, 4))
    server = TcpRendezvousServer()
    ranks = _keyed((0, 3), server, LinkKey.new(), timeout=2.0)
    out: dict[int, Any] = {}

    def run(d: int) -> None:
        b = ranks[d]
        if d == 0:
            real = b._message

            def astray(kind: bytes, key: Any, body: bytes, peer: int) -> bytes:
                if kind == b"L":  # the landed notification: for a channel nobody has
                    saved, b._channel = b._channel, "/elsewhere"
                    try:
                        return real(kind, key, body, peer)
                    finally:
                        b._channel = saved
                return real(kind, key, body, peer)

            b._message = astray  # type: ignore[method-assign]
        ex = Executor(b)
        try:
            lp = ex.load(p)
            out[d] = ex.run(lp, [value if d == 0 else None]).wait()
        except ExecutionError as e:
            out[d] = e

    threads = [threading.Thread(target=run, args=(d,), daemon=True) for d in (0, 3)]
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        took = time.monotonic() - t0
        assert isinstance(out[3], ExecutionError), out
        assert re.search(r"device 3: step 0 \(task #0 .*0->\[3\].*\) failed: device 3: nixl: "
                         r"no progress waiting for bytes from device\(s\) \[0\] within 2s",
                         str(out[3])), out[3]
        assert took < 15, took
    finally:
        for b in ranks.values():
            b.close()
        server.close()


_PEER = """
import sys, time, pickle
from reshard.comm.backends.nixl import NixlBackend
address, key = pickle.loads(bytes.fromhex(sys.argv[1]))
b = NixlBackend(0, (0, 3), address.connect(10), 30.0, link_key=key)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(120)
def test_a_dead_peer_s_receives_give_their_registrations_up():
    """Device 3 posts receives from device 0 (a process of its own) into fresh arrays,
    registering them; device 0 is SIGKILLed before it writes. Device 3's operation fails
    at its timeout naming device 0, and the receives' registrations are released at once
    (deregistered, unpinned): before, they stayed pinned and registered for the rank's
    life. Their arrays are kept alive until the rank closes (a late writer cannot land in
    reused memory), then released too."""
    import pickle
    import signal
    import subprocess
    import sys

    from reshard.comm.bootstrap.link_key import LinkKey
    from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer

    server = TcpRendezvousServer()
    key = LinkKey.new()
    peer = subprocess.Popen(
        [sys.executable, "-c", _PEER, pickle.dumps((server.address, key)).hex()],
        stdout=subprocess.PIPE, text=True)
    three = None
    try:
        assert peer.stdout.readline().strip() == "ready"
        three = NixlBackend(3, (0, 3), server.address.connect(10), 2.0, link_key=key)
        memory = three.registrations
        base = memory.held
        arrays = [np.zeros(1000 + i, np.uint8) for i in range(3)]
        three.group_start()
        for i, a in enumerate(arrays):
            three.recv(a, 0, tag=i)
        assert memory.held == base + 3 and memory.pinned == 3
        peer.send_signal(signal.SIGKILL)
        peer.wait(10)
        with pytest.raises(ExecutionError, match=r"device 3: nixl: no progress waiting for "
                                                 r"bytes from device\(s\) \[0\]"):
            three.group_end()
        assert memory.pinned == 0 and memory.held == base, (memory.pinned, memory.held)
        assert memory.abandoned == 3 and len(memory.kept) == 3
        three.close()
        assert memory.held == 0 and not memory.kept
        three = None
    finally:
        if peer.poll() is None:
            peer.kill()
        if three is not None:
            three.close()
        server.close()

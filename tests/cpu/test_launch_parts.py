"""The launchers' parts without worker processes: rendezvous, worker environment,
Ray placement, the nccl module without cupy."""

from __future__ import annotations

import threading
import time

import pytest

from reshard import Cluster, ExecutionError
from reshard.comm.bootstrap.rendezvous import TcpRendezvous, TcpRendezvousServer
from reshard.comm.launchers.host import DEFAULT_ENV, describe_exit, make_specs, worker_env

pytestmark = pytest.mark.cpu


@pytest.mark.timeout(30)
def test_rendezvous_get_waits_for_set():
    server = TcpRendezvousServer()
    try:
        reader, writer = server.address.connect(5), server.address.connect(5)
        got = {}
        th = threading.Thread(target=lambda: got.update(v=reader.get("k", 10)))
        th.start()
        time.sleep(0.2)
        writer.set("k", b"\x00\xffvalue")
        th.join(5)
        assert got["v"] == b"\x00\xffvalue"
        assert reader.get("k", 0.1) == b"\x00\xffvalue"  # stays readable
        t0 = time.monotonic()
        with pytest.raises(ExecutionError, match="not published"):
            reader.get("missing", 0.3)
        assert time.monotonic() - t0 < 5
        reader.close()
        writer.close()
    finally:
        server.close()


@pytest.mark.timeout(30)
def test_rendezvous_rejects_wrong_token():
    server = TcpRendezvousServer()
    try:
        with pytest.raises(ExecutionError, match="cannot reach"):
            TcpRendezvous(server.host, server.port, b"x" * 16).connect(1.0)
    finally:
        server.close()


@pytest.mark.timeout(30)
def test_rendezvous_close_releases_waiters():
    server = TcpRendezvousServer()
    client = server.address.connect(5)
    errors = []

    def wait() -> None:
        with pytest.raises(ExecutionError) as info:
            client.get("never", 60)
        errors.append(info.value)

    th = threading.Thread(target=wait)
    th.start()
    time.sleep(0.2)
    server.close()
    th.join(10)
    assert not th.is_alive() and errors


@pytest.mark.timeout(60)
def test_rendezvous_reaps_idle_and_caps_connections():
    """300 connections that never authenticate: at most max_pending are held (threads
    included), each closed after auth_timeout; the server keeps serving workers."""
    import socket

    server = TcpRendezvousServer(max_pending=16, max_clients=4, auth_timeout=1.0)
    threads_before = threading.active_count()
    idle = []
    try:
        for _ in range(300):
            idle.append(socket.create_connection((server.host, server.port), timeout=5))
        time.sleep(0.3)  # well before auth_timeout
        assert server.connections <= 16
        assert threading.active_count() - threads_before <= 16 + 2
        assert server.refused > 200  # (the kernel may still hold a few unaccepted)
        good = server.address.connect(5)  # a worker gets in (retrying) once they are reaped
        good.set("k", b"v")
        assert good.get("k", 1) == b"v"
        deadline = time.monotonic() + 5
        while server.connections > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.connections == 1  # the idle ones were reaped after auth_timeout
        assert threading.active_count() - threads_before <= 3
        clients = [server.address.connect(5) for _ in range(3)]  # 4 clients at once
        with pytest.raises(ExecutionError, match="cannot reach"):
            server.address.connect(0.5)  # a fifth is refused
        assert server.connections == 4
        for c in [good, *clients]:
            c.close()
    finally:
        for s in idle:
            s.close()
        server.close()


def test_rendezvous_refuses_the_wildcard():
    for host in ("0.0.0.0", "::", "", "::0", "[::0]", "0:0:0:0:0:0:0:0", "0"):
        with pytest.raises(ExecutionError, match="not"):
            TcpRendezvousServer(host)


def test_worker_env_defaults_and_placeholders():
    env = worker_env({"NCCL_HOSTID": "h{device}-r{rank}-n{host}", "X": 3}, 5, 1, 2)
    assert env["NCCL_HOSTID"] == "h5-r1-n2"
    assert env["X"] == "3"
    assert env["OMP_NUM_THREADS"] == DEFAULT_ENV["OMP_NUM_THREADS"]
    assert worker_env({"OMP_NUM_THREADS": "4"}, 0, 0, 0)["OMP_NUM_THREADS"] == "4"


def test_specs_rank_host_and_local_index():
    cluster = Cluster.from_hosts([[4, 5], [0, 1, 2]])
    specs = make_specs("gloo", [2, 0, 5, 4, 1], cluster, 7.0, None, {"A": "{rank}"})
    assert [s.device for s in specs] == [0, 1, 2, 4, 5]
    assert all(s.world == (0, 1, 2, 4, 5) for s in specs)
    assert [s.rank for s in specs] == [0, 1, 2, 3, 4]
    assert [s.host for s in specs] == [1, 1, 1, 0, 0]
    assert [s.local_index for s in specs] == [0, 1, 2, 0, 1]
    assert [s.env["A"] for s in specs] == ["0", "1", "2", "3", "4"]


def test_describe_exit():
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"


def test_ray_placement_maps_hosts_to_nodes(monkeypatch):
    ray = pytest.importorskip("ray")
    from reshard.comm.launchers import ray as ray_launcher

    nodes = [{"NodeID": n, "Alive": True, "NodeManagerAddress": ip}
             for n, ip in (("nB", "10.0.0.2"), ("nA", "10.0.0.1"), ("nC", "10.0.0.3"))]
    nodes.append({"NodeID": "dead", "Alive": False, "NodeManagerAddress": "10.0.0.0"})
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    cluster = Cluster.regular(2, 2)
    assert ray_launcher._node_plan(cluster, [0, 1, 2, 3]) == {0: "nA", 1: "nA", 2: "nB",
                                                               3: "nB"}
    # one cluster host: Ray chooses
    assert ray_launcher._node_plan(Cluster.regular(1, 4), [0, 1, 2, 3]) == dict.fromkeys(
        range(4))
    # one Ray node: Ray chooses
    monkeypatch.setattr(ray, "nodes", lambda: nodes[:1])
    assert ray_launcher._node_plan(cluster, [0, 1, 2, 3]) == dict.fromkeys(range(4))
    # fewer nodes than hosts: round-robin
    monkeypatch.setattr(ray, "nodes", lambda: nodes[:2])
    plan = ray_launcher._node_plan(Cluster.regular(3, 1), [0, 1, 2])
    assert plan == {0: "nA", 1: "nB", 2: "nA"}


def test_nccl_module_imports_without_cupy():
    from reshard.comm.backend import backend_class
    from reshard.comm.backends import nccl

    cls = backend_class("nccl")
    assert cls is nccl.NcclBackend
    uid = tuple(range(-128, 0))
    assert nccl.decode_unique_id(nccl.encode_unique_id(uid)) == uid
    assert nccl.decode_unique_id(nccl.encode_unique_id(b"\x01\x80")) == b"\x01\x80"
    if not nccl.available():
        with pytest.raises(ExecutionError, match="nccl"):
            cls(0, (0,), None, 1.0)


@pytest.mark.timeout(30)
def test_commands_go_down_the_pipe_in_order():
    """A small command goes down its worker's pipe on the caller's thread when nothing
    is queued before it; a large one, and every one after it until the writer has sent
    them, goes through the writer thread: the worker reads them in submission order."""
    import multiprocessing as mp
    from concurrent.futures import Future
    from multiprocessing.reduction import ForkingPickler

    from reshard.comm.launchers.host import WorkerSpec
    from reshard.comm.launchers.process import _DIRECT, _Worker

    worker_end, driver_end = mp.Pipe(duplex=False)
    spec = WorkerSpec("gloo", 0, (0,), 5.0, None)
    w = _Worker(spec, type("P", (), {"pid": None})(), driver_end, worker_end)

    def post(i, size):
        w.post(i, "test", bytes(ForkingPickler.dumps((i, b"x" * size))))

    post(1, 10)  # the writer thread is not running: only a direct write gets through
    assert worker_end.poll(1) and worker_end.recv()[0] == 1
    post(2, 2 * _DIRECT)  # too large: queued for the writer
    post(3, 10)  # small, but behind 2: queued too
    assert not worker_end.poll(0.2)
    w.writer.start()
    assert [worker_end.recv()[0] for _ in range(2)] == [2, 3]
    post(4, 10)
    assert worker_end.recv()[0] == 4
    # a broken pipe fails the call's future instead of raising in the caller
    fut: Future = Future()
    w.pending[5] = fut
    worker_end.close()
    post(5, 10)
    with pytest.raises(ExecutionError, match="device 0: cannot send test"):
        fut.result(5)
    w.stop_writer()
    w.writer.join(5)
    driver_end.close()


@pytest.mark.timeout(60)
def test_rendezvous_strangers_trickling_bytes_keep_no_worker_out():
    """64 connections that each send one byte of a token every 0.5 s (the per-byte
    timeout once kept them for ever, holding every pending slot): each is closed at
    its one deadline, and a worker connecting meanwhile gets in at once."""
    import socket

    server = TcpRendezvousServer(max_pending=64, auth_timeout=1.5)
    stop = threading.Event()
    strangers = [socket.create_connection((server.host, server.port), timeout=5)
                 for _ in range(64)]
    cut: list[float] = []
    t0 = time.monotonic()

    def trickle(s: socket.socket) -> None:
        try:
            for _ in range(30):
                if stop.wait(0.5):
                    return
                s.send(b"x")
        except OSError:
            cut.append(time.monotonic() - t0)

    threads = [threading.Thread(target=trickle, args=(s,), daemon=True) for s in strangers]
    try:
        for t in threads:
            t.start()
        time.sleep(0.7)  # every slot held by a stranger mid-token
        w0 = time.monotonic()
        good = server.address.connect(5)
        assert time.monotonic() - w0 < 1.0  # admitted at once: an oldest stranger made room
        good.set("k", b"v")
        assert good.get("k", 1) == b"v"
        for t in threads:
            t.join(10)
        assert len(cut) == 64  # every stranger closed...
        assert max(cut) < 1.5 + 2.0  # ...within its one deadline (plus a trickle's wait)
        good.close()
    finally:
        stop.set()
        for s in strangers:
            s.close()
        server.close()


@pytest.mark.timeout(60)
def test_fork_server_exits_without_the_interpreters_teardown(tmp_path, monkeypatch):
    # what the server preloaded (torch, for gloo) is not torn down when the driver closes
    # it: the server leaves at once (a teardown took the Runtime's close 1-2 s)
    from reshard.comm.launchers.spawn import ForkServer

    marker = tmp_path / "teardown-ran"
    (tmp_path / "rs_preload_probe.py").write_text(
        "import atexit, os\n"
        "atexit.register(lambda: open(os.environ['RS_PROBE_MARKER'], 'w').close())\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the server imports as the driver does
    monkeypatch.setenv("RS_PROBE_MARKER", str(marker))
    server = ForkServer(["rs_preload_probe"])
    proc = server._proc
    server.close()
    assert proc.returncode == 0
    assert not marker.exists()

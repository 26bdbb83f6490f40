"""Faults on real workers: a worker killed mid-plan, a stuck worker, a killed driver,
and cleanup (no worker process or actor survives its runtime)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, ExecutionError, Layout
from reshard.comm.calls import Ping
from reshard.runtime import Runtime

from ._helpers import check_shards, pid_alive, wait_gone

pytestmark = pytest.mark.cpu

NEEDS_NIXL = pytest.mark.skipif(importlib.util.find_spec("nixl") is None,
                                reason="the nixl extra is not installed")

CLUSTER = Cluster.regular(2, 2)  # four workers
SRC = Layout(DeviceMesh((2,), [0, 1]), "S0R")
DST = Layout(DeviceMesh((2,), [2, 3]), "RS0")
SHAPE = (512, 1024)  # 2 MiB of float32


def _run_in_thread(fn):
    """Start ``fn`` in a thread; returns a dict that gets ``result`` / ``error`` and
    ``seconds``."""
    box: dict = {}

    def target():
        t0 = time.monotonic()
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            box["error"] = e
        box["seconds"] = time.monotonic() - t0

    th = threading.Thread(target=target, daemon=True)
    th.start()
    box["thread"] = th
    return box


def _reshard_with_victim(rt: Runtime, victim: int, kill: bool) -> dict:
    """Stop ``victim`` with SIGSTOP, run a plan that needs it, and (if ``kill``) kill it
    with SIGKILL once the other workers are blocked inside the plan."""
    value = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    x = rt.put(value, SRC)
    plan = rt.plan(x, DST, "broadcast")
    rt.load(plan)
    pid = rt.group.pids[victim]
    os.kill(pid, signal.SIGSTOP)
    box = _run_in_thread(lambda: rt.execute(plan, [x]))
    time.sleep(1.0)  # the others are now waiting on the victim inside the plan
    assert box["thread"].is_alive(), "the plan finished without its stopped worker"
    if kill:
        os.kill(pid, signal.SIGKILL)
    box["thread"].join(rt.timeout + 15)
    assert not box["thread"].is_alive(), "reshard hangs"
    return box


@pytest.fixture(params=["process", "ray"])
def launcher(request):
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    return request.param


@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", ["gloo", "tcp", pytest.param("nixl", marks=NEEDS_NIXL)])
def test_worker_killed_mid_plan(launcher, backend):
    timeout = 20.0
    rt = Runtime(backend, CLUSTER, launcher, timeout=timeout)
    pids = dict(rt.group.pids)
    try:
        box = _reshard_with_victim(rt, victim=3, kill=True)
        with pytest.raises(ExecutionError, match="failed earlier"):  # shut down for good
            rt.put(np.zeros(SHAPE, np.float32), SRC)
    finally:
        rt.close()
    err = box.get("error")
    print(err)
    assert isinstance(err, ExecutionError), box
    assert box["seconds"] < timeout, f"error after {box['seconds']:.1f}s"
    text = str(err)
    assert "device 3" in text and ("died" in text or "killed" in text), text
    # the tasks it took part in are named (by the driver; a surviving peer that was
    # still waiting on it also names the task it was on)
    assert "task #" in text, text
    assert wait_gone(pids.values()) == [], "worker processes survive the runtime"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["gloo", "tcp", pytest.param("nixl", marks=NEEDS_NIXL)])
def test_stuck_worker_times_out(backend):
    timeout = 4.0
    rt = Runtime(backend, CLUSTER, "process", timeout=timeout)
    pids = dict(rt.group.pids)
    try:
        box = _reshard_with_victim(rt, victim=2, kill=False)
    finally:
        rt.close()
    err = box.get("error")
    assert isinstance(err, ExecutionError), box
    # the workers' own timeout fires; the driver gives up at timeout + 5 s at the latest
    assert box["seconds"] < timeout + 9, f"error after {box['seconds']:.1f}s"
    assert "task #" in str(err), str(err)
    assert wait_gone(pids.values()) == [], "a stopped worker survived close()"


@pytest.mark.timeout(90)
def test_close_leaves_no_process():
    with Runtime("gloo", CLUSTER, "process", timeout=20) as rt:
        pids = dict(rt.group.pids)
        server = rt.group.spawner.pid  # the group's fork server
        assert pid_alive(server)
        assert sorted(pids) == [0, 1, 2, 3]
        assert all(pid_alive(p) for p in pids.values())
        value = np.arange(24, dtype=np.int64).reshape(4, 6)
        (y,) = rt.reshard_many([rt.put(value, SRC)], [DST], "allgather")
        check_shards(rt, y, value)
    assert wait_gone([*pids.values(), server], 5.0) == []
    assert rt.group.dead() == {}  # a closed group reports nothing


@pytest.mark.timeout(120)
def test_ray_actors_killed_on_close(ray_session):
    ray = ray_session
    rt = Runtime("gloo", CLUSTER, "ray", timeout=20)
    actors = dict(rt.group.actors)
    pids = dict(rt.group.pids)
    value = np.arange(40, dtype=np.float64).reshape(8, 5)
    y = rt.reshard(rt.put(value, SRC), DST, "send_recv")
    check_shards(rt, y, value)
    rt.close()
    assert wait_gone(pids.values(), 1.0) == []  # close() waits for local actors to exit
    for actor in actors.values():
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.call.remote(Ping()), timeout=30)


@pytest.mark.timeout(120)
def test_workers_die_with_their_driver(tmp_path):
    """SIGKILL the driver: its worker processes exit on their own."""
    script = textwrap.dedent("""
        import sys, time
        from reshard import Cluster
        from reshard.runtime import Runtime
        if __name__ == "__main__":
            rt = Runtime("gloo", Cluster.regular(1, 2), "process", timeout=20)
            print(" ".join(str(p) for p in rt.group.pids.values()), flush=True)
            time.sleep(600)
    """)
    path = tmp_path / "driver.py"
    path.write_text(script)
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2 and all(pid_alive(p) for p in pids), line
        proc.kill()
        proc.wait(10)
        assert wait_gone(pids, 10.0) == [], "workers outlived their driver"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.timeout(120)
def test_interrupted_driver_stops_its_workers(tmp_path):
    """Ctrl-C while a plan waits on a stuck worker: the runtime closes and raises
    KeyboardInterrupt; no worker survives."""
    script = textwrap.dedent("""
        import os, signal
        import numpy as np
        from reshard import Cluster, DeviceMesh, Layout
        from reshard.runtime import Runtime
        if __name__ == "__main__":
            rt = Runtime("gloo", Cluster.regular(1, 2), "process", timeout=60)
            x = rt.put(np.ones((4, 4)), Layout(DeviceMesh((1,), [0]), "RR"))
            os.kill(rt.group.pids[1], signal.SIGSTOP)
            print(" ".join(str(p) for p in rt.group.pids.values()), flush=True)
            try:
                rt.reshard(x, Layout(DeviceMesh((1,), [1]), "RR"))
            except KeyboardInterrupt:
                print("interrupted closed=%s" % rt.closed, flush=True)
            rt.close()
            print("closed", flush=True)
    """)
    path = tmp_path / "driver.py"
    path.write_text(script)
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, pids
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: driver and workers
        out, _ = proc.communicate(timeout=30)
        assert "interrupted closed=True" in out and "closed\n" in out, out
        assert wait_gone(pids, 5.0) == []
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.timeout(120)
def test_ctrl_c_inside_a_lock_still_closes_the_driver(tmp_path):
    """Issue 61, item 12: Python raises KeyboardInterrupt between any two bytecodes,
    also inside ``threading.Condition.__enter__`` once its lock is taken. The driver
    here raises SIGINT at exactly that point (the first Condition its main thread
    enters one second into a reshard waiting on a stopped worker): the lock was left
    held, the failure's shutdown thread blocked on it for ever, and ``close()`` waited
    on that thread: the driver never exited. Now a Ctrl-C while the driver waits is
    recorded and raised where nothing is held: close returns at once, no worker
    survives."""
    script = textwrap.dedent("""
        import os, signal, threading, time
        import numpy as np
        from reshard import Cluster, DeviceMesh, Layout
        from reshard.runtime import Runtime

        armed = []
        enter = threading.Condition.__enter__

        def enter_then_interrupt(self):
            got = enter(self)
            if armed and threading.current_thread() is threading.main_thread():
                armed.clear()
                signal.raise_signal(signal.SIGINT)  # lands with this lock held
            return got

        threading.Condition.__enter__ = enter_then_interrupt
        if __name__ == "__main__":
            rt = Runtime("gloo", Cluster.regular(1, 2), "process", timeout=60)
            x = rt.put(np.ones((4, 4)), Layout(DeviceMesh((1,), [0]), "RR"))
            os.kill(rt.group.pids[1], signal.SIGSTOP)
            print(" ".join(str(p) for p in rt.group.pids.values()), flush=True)
            threading.Timer(1.0, armed.append, (True,)).start()
            try:
                rt.reshard(x, Layout(DeviceMesh((1,), [1]), "RR"))
            except KeyboardInterrupt:
                print("interrupted closed=%s" % rt.closed, flush=True)
            t0 = time.monotonic()
            rt.close()
            print("closed in %.1f s" % (time.monotonic() - t0), flush=True)
    """)
    path = tmp_path / "driver.py"
    path.write_text(script)
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, pids
        out, _ = proc.communicate(timeout=40)  # was: alive until killed
        assert "interrupted closed=True" in out, out
        took = float(out.split("closed in ")[1].split()[0])
        assert took < 10.0, out  # not the shutdown's bounded wait (ABORT_WAIT, 15 s)
        assert wait_gone(pids, 5.0) == []
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.timeout(90)
def test_spawn_start_method(monkeypatch):
    """The plain spawn start method works too (slower start, same workers); an int16
    partial sum goes through gloo's widened reduce."""
    monkeypatch.setenv("RESHARD_START_METHOD", "spawn")
    value = (np.arange(30, dtype=np.int16) * 1500).reshape(5, 6)  # wraps around int16
    with Runtime("gloo", Cluster.regular(1, 2), "process", timeout=20) as rt:
        src = Layout(DeviceMesh((2,), [0, 1]), "RR+P0")
        dst = Layout(DeviceMesh((2,), [0, 1]), "S0R")
        half = (value // 2).astype(np.int16)
        x = rt.put_shards({0: half, 1: (value - half).astype(np.int16)}, src, value.shape,
                          value.dtype)
        check_shards(rt, rt.reshard(x, dst, "broadcast"), value)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_script_without_main_guard(tmp_path, method):
    """Workers start from reshard's entry point: a script with no ``__main__`` guard
    runs, and is not re-run inside its workers."""
    script = textwrap.dedent("""
        import numpy as np
        from reshard import Cluster, DeviceMesh, Layout
        from reshard.runtime import Runtime
        print("script body ran", flush=True)
        rt = Runtime("gloo", Cluster.regular(2, 2), "process", timeout=30)
        value = np.arange(48.0).reshape(8, 6)
        x = rt.put(value, Layout(DeviceMesh((2,), [0, 1]), "S0R"))
        y = rt.reshard(x, Layout(DeviceMesh((2,), [2, 3]), "RS0"))
        assert (rt.get(y) == value).all()
        rt.close()
        print("done", flush=True)
    """)
    path = tmp_path / "no_guard.py"
    path.write_text(script)
    env = {**os.environ, "RESHARD_START_METHOD": method}
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=100, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["script", "body", "ran", "done"], proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]

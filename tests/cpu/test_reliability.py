"""Reliability of a gloo Runtime on real worker processes: threads sharing one Runtime
get exact results; user mistakes raise and leave it usable; tampered plans are refused
before any byte moves; loaded plans and memory stay bounded; nothing listens on the
wildcard; an embedded Ray goes with a killed driver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from reshard import (
    Cluster,
    DeviceMesh,
    DTypeError,
    ExecutionError,
    Layout,
    PlanError,
    ReshardError,
    ReshardPlan,
    ShapeError,
)
from reshard.comm.calls import Stats
from reshard.runtime import Runtime

from ..common import in_threads, put_value
from ._helpers import check_shards, pid_alive, sample, wait_gone

pytestmark = pytest.mark.cpu

CLUSTER = Cluster.regular(2, 2)
A = DeviceMesh((2,), [0, 1])
B = DeviceMesh((2,), [2, 3])
AB = DeviceMesh((2, 2), [0, 1, 2, 3])


@pytest.fixture(scope="module")
def rt():
    with Runtime("gloo", CLUSTER, "process", timeout=30, max_plans=8) as runtime:
        yield runtime


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


# ----- threads -----------------------------------------------------------------------------
THREAD_CASES = [  # (src, dst) over the four workers; transposes, overlaps, partial sums
    (Layout(A, "S0R"), Layout(B, "RS0")),
    (Layout(B, "RS0"), Layout(A, "S0R")),
    (Layout(A, "RR"), Layout(AB, "S0S1")),
    (Layout(AB, "S1S0"), Layout(A, "RS0")),
    (Layout(AB, "S0R+P1"), Layout(B, "RR")),
    (Layout(A, "S0R"), Layout(A, "RS0")),
]


@pytest.mark.timeout(240)
def test_threads_sharing_a_runtime_get_their_own_data(rt):
    """8 threads, each putting its own arrays and resharding them with every strategy
    on one Runtime, with a tiny switch interval: every result byte-exact."""
    done: list[int] = []

    def worker(k: int) -> None:
        rng = np.random.default_rng(k)
        for i in range(18):
            src, dst = THREAD_CASES[(k + i) % len(THREAD_CASES)]
            shape = (8 + k, 6 + i % 5)  # each thread's own shapes (own plans)
            value = sample(rng, shape, ("int32", "float64", "int16")[i % 3])
            x = put_value(rt, value, src, rng)  # random addends where partial
            y = rt.reshard(x, dst, ("broadcast", "send_recv", "allgather")[i % 3])
            check_shards(rt, y, value)
            rt.free(x, y)
            done.append(k)

    errors = in_threads(worker, 8, 200)
    assert not errors, errors[:3]
    assert len(done) == 8 * 18
    stats = rt.call({d: Stats() for d in rt.group.devices}, "stats")
    assert all(s["arrays"] == 0 for s in stats.values()), stats  # every array freed


# ----- user mistakes ------------------------------------------------------------------------
def _still_works(rt) -> None:
    value = np.arange(24, dtype=np.int64).reshape(4, 6)
    x = rt.put(value, Layout(A, "S0R"))
    y = rt.reshard(x, Layout(B, "RS0"))
    check_shards(rt, y, value)
    rt.free(x, y)


@pytest.mark.timeout(120)
def test_user_mistakes_leave_the_runtime_usable(rt):
    x = rt.put(np.ones((4, 6)), Layout(A, "S0R"))
    rt.free(x)
    for call in (lambda: rt.get(x), lambda: rt.shards(x), lambda: rt.free(x),
                 lambda: rt.reshard(x, Layout(B, "RS0"))):
        with pytest.raises(ReshardError, match="was freed"):
            call()
        _still_works(rt)
    with Runtime("local") as other:
        foreign = other.put(np.ones((4, 6)), Layout(A, "S0R"))
    with pytest.raises(ReshardError, match="does not belong to this Runtime"):
        rt.get(foreign)
    with pytest.raises(ShapeError, match="equal-length"):
        rt.put([[1, 2], [3]], Layout(A, "S0R"))
    with pytest.raises(DTypeError):
        rt.put(np.array([object(), object()]), Layout(A, "S0"))
    with pytest.raises(DTypeError, match=r"float128.*valid dtypes"):
        rt.put(np.ones((4, 6), dtype=np.longdouble), Layout(A, "S0R"))
    # casts that cannot be done: refused when planned, before any byte moves
    part = Layout(AB, "S0R+P1")
    y = rt.put(np.ones((4, 6), dtype="bfloat16"), part)
    with pytest.raises(DTypeError, match="partial sum needs the sum's amax"):
        rt.reshard(y, Layout(B, "RR"), cast="float8_e4m3fn", scale="block128")
    with pytest.raises(DTypeError, match="cannot cast to int8"):
        rt.reshard(y, Layout(B, "RR"), cast="int8")
    rt.free(y)
    _still_works(rt)


@pytest.mark.timeout(120)
def test_tampered_plans_refused_before_any_byte_moves(rt):
    value = np.arange(48, dtype=np.int32).reshape(8, 6)
    x = rt.put(value, Layout(A, "S0R"))
    good = rt.plan(x, Layout(B, "RS0"), "send_recv")
    d = good.to_dict()
    tampered = []
    e = good.to_dict()
    del e["tasks"][0]
    tampered.append(e)
    e = good.to_dict()
    e["tasks"][0]["box"] = [[-2, 2], [0, 3]]
    tampered.append(e)
    e = good.to_dict()
    e["tasks"][0]["receivers"] = []
    tampered.append(e)
    e = good.to_dict()
    e["tasks"][0]["tensor"] = 7
    tampered.append(e)
    for bad in tampered:
        t0 = time.perf_counter()
        with pytest.raises(PlanError, match=r"task #|undelivered"):
            ReshardPlan.from_dict(bad)
        assert time.perf_counter() - t0 < 0.5
        # a plan object built around the checks is refused by the Runtime too
        forged = ReshardPlan.from_dict(bad, verify=False) if _decodes(bad) else None
        if forged is not None:
            with pytest.raises(PlanError, match=r"task #|undelivered"):
                rt.execute(forged, [x])
            with pytest.raises(PlanError):
                rt.load(forged)
    (y,) = rt.execute(ReshardPlan.from_dict(d), [x])
    check_shards(rt, y, value)
    rt.free(x, y)


def _decodes(d: dict) -> bool:
    try:
        ReshardPlan.from_dict(d, verify=False)
        return True
    except PlanError:
        return False


# ----- memory ---------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_memory_stays_flat_over_1000_cycles(rt):
    """1,000 put/reshard/free cycles, every one a new shape (a new plan with its
    scratch): at most max_plans stay loaded, worker memory flat after warm-up."""
    src, dst = Layout(A, "S0R"), Layout(B, "RS0")  # column split: packs through scratch
    pids = rt.group.pids
    rss = {}
    for i in range(1000):
        shape = (64 + i % 50, 1000 + i // 50)  # all distinct, bounded size
        x = rt.put(np.ones(shape, np.float32), src)
        y = rt.reshard(x, dst)
        rt.free(x, y)
        if i == 199:
            rss = {d: _rss_mib(p) for d, p in pids.items()}
        if i % 100 == 99:
            stats = rt.call({d: Stats() for d in rt.group.devices}, "stats")
            assert all(s["plans"] <= rt.max_plans and s["arrays"] == 0
                       for s in stats.values()), stats
            assert rt.loaded_plans <= rt.max_plans
    grown = {d: _rss_mib(p) - rss[d] for d, p in pids.items()}
    print("RSS growth cycles 200..1000 (MiB):", grown)
    assert all(g < 24 for g in grown.values()), grown


@pytest.mark.timeout(120)
def test_pinned_plans_stay_until_unloaded():
    with Runtime("local", max_plans=2) as rt:
        value = np.arange(24.0).reshape(4, 6)
        x = rt.put(value, Layout(A, "S0R"))
        pinned = rt.plan(x, Layout(B, "RS0"))
        rt.load(pinned)
        for spec, strategy in (("RR", "broadcast"), ("S0R", "send_recv"),
                               ("RS0", "send_recv"), ("RR", "allgather")):
            rt.free(rt.reshard(x, Layout(B, spec), strategy))
        assert rt.loaded_plans == 3  # two cached + the pinned one
        (y,) = rt.execute(pinned, [x])
        check_shards(rt, y, value)
        rt.unload(pinned)
        assert rt.loaded_plans == 2


@pytest.mark.timeout(120)
def test_runtimes_leave_no_thread_or_file_behind():
    """Runtimes closed normally or after a killed worker leave the driver with the
    threads and open files it had."""
    src, dst = Layout(A, "S0R"), Layout(B, "RS0")

    def footprint():
        return threading.active_count(), len(os.listdir("/proc/self/fd"))

    with Runtime("gloo", CLUSTER, "process", timeout=10) as warm:
        warm.reshard(warm.put(np.ones((8, 8)), src), dst)
    before = footprint()
    for kill in (False, True, False):
        with Runtime("gloo", CLUSTER, "process", timeout=10) as rt2:
            x = rt2.put(np.ones((8, 8)), src)
            rt2.reshard(x, dst)
            if kill:
                os.kill(rt2.group.pids[2], signal.SIGKILL)
                with pytest.raises(ExecutionError, match="device 2"):
                    rt2.reshard(x, dst)
    deadline = time.monotonic() + 5
    while footprint() != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert footprint() == before, (footprint(), before, [t.name for t in threading.enumerate()])


# ----- sockets --------------------------------------------------------------------------------
def _listening(pids) -> list[tuple[str, str, int]]:
    """(family, local address, pid) of every TCP socket in LISTEN state the pids own."""
    inodes = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = pid
    out = []
    for fam in ("tcp", "tcp6"):
        with open(f"/proc/net/{fam}") as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    out.append((fam, fields[1], inodes[fields[9]]))
    return out


@pytest.mark.timeout(120)
def test_nothing_listens_on_the_wildcard(rt):
    """The driver's rendezvous, rank 0's TCPStore and gloo's pair sockets all listen
    on loopback only."""
    _still_works(rt)
    rendezvous = rt.group.rendezvous.port
    driver = [s for s in _listening([os.getpid()]) if int(s[1].split(":")[1], 16) == rendezvous]
    assert len(driver) == 1, driver  # (a Ray driver in this process has its own sockets)
    socks = driver + _listening([rt.group.spawner.pid, *rt.group.pids.values()])
    assert len(socks) >= 1 + len(rt.group.pids)  # rendezvous + every rank's gloo listener
    for fam, local, pid in socks:
        addr = local.split(":")[0]
        loopback = addr == "0100007F" if fam == "tcp" else addr.endswith("01000000")
        assert loopback, f"pid {pid} listens on {fam} {local}"


# ----- timeouts -------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_stuck_worker_reported_at_the_timeout():
    timeout = 3.0
    with Runtime("gloo", CLUSTER, "process", timeout=timeout) as rt2:
        x = rt2.put(np.ones((64, 64), np.float32), Layout(A, "S0R"))
        plan = rt2.plan(x, Layout(B, "RS0"), "broadcast")
        rt2.load(plan)
        pid = rt2.group.pids[3]
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(ExecutionError) as info:
            rt2.execute(plan, [x])
        took = time.monotonic() - t0  # (the failed runtime killed the stopped worker)
    assert timeout <= took < timeout + 0.75, f"reported after {took:.2f}s"
    assert "device 3" in str(info.value) and "stuck" in str(info.value), str(info.value)


# ----- an embedded Ray goes with its driver ------------------------------------------------
def _descendants(pid: int) -> list[int]:
    from reshard.comm.launchers.raywatch import children_of

    out, todo = [], [pid]
    while todo:
        for c in children_of(todo.pop()):
            out.append(c)
            todo.append(c)
    return out


@pytest.mark.timeout(180)
def test_embedded_ray_dies_with_a_killed_driver(tmp_path):
    script = textwrap.dedent("""
        import time
        from reshard import Cluster
        from reshard.runtime import Runtime
        rt = Runtime("gloo", Cluster.regular(1, 2), "ray", timeout=30)
        print("ready", flush=True)
        time.sleep(600)
    """)
    path = tmp_path / "ray_driver.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        ray_pids = _descendants(proc.pid)
        names = []
        for p in ray_pids:
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    names.append(f.read().split(b"\0")[0].decode(errors="replace"))
            except OSError:
                pass
        assert any("Agent" in n for n in names), names  # the ones that used to survive
        proc.kill()
        proc.wait(10)
        left = wait_gone(ray_pids, 30.0)
        assert left == [], f"Ray processes outlived their driver: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in _descendants(proc.pid):
            if pid_alive(p):
                os.kill(p, signal.SIGKILL)

"""The machine side of the testbed: iproute2 commands, the links, namespaces and
qdiscs that exist, the owner records that tell a dead run's leftovers from a live
one's (:func:`cleanup_stale`), and whether a testbed can be built here
(:func:`available`). :mod:`reshard.testbed` builds on these."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

from reshard.comm.launchers.netns import enter_netns
from reshard.errors import ReshardError

NS_IFNAME = "rsnic0"  # the host's NIC, inside its namespace (names are per namespace)
STATE_DIR = "/run/reshard-testbed"  # owner records (pid, start time) and the lock
_NAME = re.compile(r"^rs-(\d+)(?:-(\d+|p))?-(h\d+|br)$")  # p: availability probe
_RAY_DIR = re.compile(r"^(rs-\d+(?:-\d+)?)-ray-")  # a RayCluster's directory: <tag>-ray-*
_CLONE_NEWNET = 0x40000000


class TestbedError(ReshardError, RuntimeError):
    """The testbed cannot be built here, or a command that builds it failed (a
    :class:`~reshard.ReshardError`; also a ``RuntimeError``, as it always was)."""

    __test__ = False  # not a pytest test class


# ----- commands ------------------------------------------------------------------------
def run_ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run an iproute2 command; raise :class:`TestbedError` with its stderr if it fails."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TestbedError(f"`{' '.join(argv)}` could not run: {e}") from e
    if check and proc.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def links() -> list[str]:
    """Names of the links of the root namespace."""
    out = run_ip("ip", "-o", "link", "show").stdout
    return [m.group(1) for m in re.finditer(r"^\d+:\s+([^:@\s]+)", out, re.MULTILINE)]


def namespaces() -> list[str]:
    """Names of the named network namespaces (``ip netns list``)."""
    out = run_ip("ip", "netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def qdisc_devices() -> list[str]:
    """Devices of the root namespace that carry a shaping qdisc (tbf, netem)."""
    out = run_ip("tc", "qdisc", "show").stdout
    return sorted({m.group(2) for m in re.finditer(r"^qdisc (tbf|netem) \S+ dev (\S+)", out,
                                                    re.MULTILINE)})


# ----- ownership -----------------------------------------------------------------------
def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a live owner from a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_alive(pid: int, tag: str) -> bool:
    """True if the process that created ``tag`` is still running."""
    started = start_time(pid)
    if started is None:
        return False
    try:
        with open(os.path.join(STATE_DIR, tag)) as f:
            recorded = f.read().split()
    except OSError:
        return True  # no record (yet): trust the pid
    return len(recorded) < 2 or recorded[1] == started


def tag_of(name: str) -> tuple[int, str] | None:
    """(owner pid, tag) of one of this module's names, else None."""
    m = _NAME.match(name)
    if not m:
        return None
    tag = f"rs-{m.group(1)}" + (f"-{m.group(2)}" if m.group(2) else "")
    return int(m.group(1)), tag


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """An exclusive lock shared by every testbed of the machine (subnet choice)."""
    os.makedirs(STATE_DIR, exist_ok=True)
    fd = os.open(os.path.join(STATE_DIR, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def cleanup_stale(verbose: bool = False) -> list[str]:
    """Remove the namespaces, links (with their qdiscs) and records of testbeds whose
    creating process is gone (e.g. killed by SIGKILL). Live testbeds are left alone.

    Also removes the directories named after such a testbed in the temporary
    directory (a :class:`~reshard.microbench.infra.ray_cluster.RayCluster`'s token and logs).

    Returns:
        What was removed, as ``"netns NAME"`` / ``"link NAME"`` / ``"dir PATH"`` /
        ``"record TAG"``.
    """
    removed: list[str] = []
    live: dict[str, bool] = {}

    def stale(name: str) -> bool:
        owner = tag_of(name)
        if owner is None:
            return False
        pid, tag = owner
        if tag not in live:
            live[tag] = owner_alive(pid, tag)
        return not live[tag]

    # veths first (each takes its peer in a namespace along), then bridges
    doomed = sorted((n for n in links() if stale(n)), key=lambda n: n.endswith("-br"))
    for name in doomed:
        if run_ip("ip", "link", "del", name, check=False).returncode == 0:
            removed.append(f"link {name}")
    for name in namespaces():
        if stale(name) and run_ip("ip", "netns", "del", name, check=False).returncode == 0:
            removed.append(f"netns {name}")
    tmp = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(tmp):
            m = _RAY_DIR.match(name)
            if m and stale(f"{m.group(1)}-br"):
                shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
                removed.append(f"dir {os.path.join(tmp, name)}")
    with contextlib.suppress(OSError):
        for tag in os.listdir(STATE_DIR):
            owner = tag_of(f"{tag}-br")
            if owner is not None and not owner_alive(*owner):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(STATE_DIR, tag))
                    removed.append(f"record {tag}")
    if verbose:
        for what in removed:
            print(f"removed stale {what}")
    return removed


# ----- availability --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Availability:
    """Whether testbeds can be built here; ``reason`` says why not (or what works)."""

    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


@functools.cache
def available(latency: bool = False) -> Availability:
    """Check, once per process, that a testbed can be built: root, ``ip`` and ``tc``,
    and a probe namespace with a veth pair, a bridge and a ``tbf`` qdisc (``netem``
    too when ``latency``) can be made and removed.

    Args:
        latency: also require ``netem`` (needed for ``latency_ms > 0``).
    """
    if not sys.platform.startswith("linux"):
        return Availability(False, f"network namespaces need Linux, this is {sys.platform}")
    if os.geteuid() != 0:
        return Availability(False, "network namespaces and tc need root (euid 0)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return Availability(False, f"`{tool}` (iproute2) is not on PATH")
    tag = f"rs-{os.getpid()}-p"  # names cleanup_stale recognises, should this crash
    ns = a = f"{tag}-h0"
    br = f"{tag}-br"
    steps = [
        ("create a network namespace", ["ip", "netns", "add", ns]),
        ("create a veth pair", ["ip", "link", "add", a, "type", "veth", "peer", "name",
                                NS_IFNAME, "netns", ns]),
        ("create a bridge", ["ip", "link", "add", br, "type", "bridge"]),
        ("add a tbf qdisc", ["tc", "qdisc", "add", "dev", a, "root", "tbf", "rate",
                             "100mbit", "burst", "128kb", "limit", "1mb"]),
    ]
    if latency:
        steps.append(("add a netem qdisc (latency)",
                      ["tc", "-n", ns, "qdisc", "add", "dev", NS_IFNAME, "root", "netem",
                       "delay", "1ms"]))
    try:
        for what, argv in steps:
            proc = run_ip(*argv, check=False)
            if proc.returncode != 0:
                return Availability(False, f"cannot {what}: `{' '.join(argv)}`: "
                                           f"{proc.stderr.strip()}")
        with in_netns(ns):  # what workers do
            pass
    except TestbedError as e:
        return Availability(False, str(e))
    finally:
        run_ip("ip", "link", "del", a, check=False)
        run_ip("ip", "link", "del", br, check=False)
        run_ip("ip", "netns", "del", ns, check=False)
    return Availability(True, "root, iproute2, netns, veth, bridge, tbf"
                        + (", netem" if latency else ""))


@contextlib.contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Run the body with the calling thread in namespace ``name``, then move it back."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        enter_netns(name)
        try:
            yield
        finally:
            import ctypes

            if ctypes.CDLL(None, use_errno=True).setns(home, _CLONE_NEWNET) != 0:
                raise TestbedError(f"cannot move back from network namespace {name}: "
                                   f"{os.strerror(ctypes.get_errno())}")
    finally:
        os.close(home)

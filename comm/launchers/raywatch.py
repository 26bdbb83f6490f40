"""Ray processes that reshard started go with their driver.

``ray.init()`` without an address starts a local cluster whose head processes are
children of the driver (gcs_server, raylet, monitors) and whose agents and workers
are their children. When the driver dies by SIGKILL, gcs_server and raylet follow
it, but the dashboard and runtime-env agents outlive it. :func:`watch_ray` starts a
small watchdog process (its own session, so a terminal's Ctrl-C leaves it alone)
that follows the process tree of the Ray processes the driver just started and,
once the driver is gone, stops whatever of that tree is left (SIGTERM, then
SIGKILL). It never touches a Ray it did not see started, nor other children of the
driver. The emulated testbed's Ray cluster
(:class:`~reshard.microbench.infra.ray_cluster.RayCluster`) watches its nodes' ``ray start``
processes the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

_ENTRY = "from reshard.comm.launchers.raywatch import main; main()"


def children_of(pid: int) -> set[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    return {p for p, parent in _parents().items() if parent == pid}


def process_tree(roots: Iterable[int]) -> set[int]:
    """The live processes of ``roots`` and all their descendants (Linux /proc)."""
    parents = _parents()
    kids: dict[int, list[int]] = {}
    for p, parent in parents.items():
        kids.setdefault(parent, []).append(p)
    out: set[int] = set()
    todo = [r for r in roots if r in parents]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo.extend(kids.get(p, ()))
    return out


def _stat(pid: int | str) -> tuple[bytes, int, int] | None:
    """(state, parent pid, start time) of a process from /proc, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _parents() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        stat = _stat(name) if name.isdigit() else None
        if stat is not None:
            out[int(name)] = stat[1]
    return out


def start_time(pid: int) -> int | None:
    stat = _stat(pid)
    return None if stat is None else stat[2]


def _subtree(roots: Iterable[int], known: dict[int, int | None]) -> None:
    """Add every live descendant of ``roots`` (and of what ``known`` holds) to ``known``
    with its start time (pids are only trusted while the start time matches)."""
    parents = _parents()
    kids: dict[int, list[int]] = {}
    for p, parent in parents.items():
        kids.setdefault(parent, []).append(p)
    todo = [p for p in (*roots, *known) if p in parents]
    while todo:
        p = todo.pop()
        for c in kids.get(p, ()):
            if c not in known:
                known[c] = start_time(c)
                todo.append(c)
    for r in roots:
        if r not in known and r in parents:
            known[r] = start_time(r)


def _alive(pid: int, started: int | None) -> bool:
    """True while the process runs (not a zombie) and is the one seen at ``started``."""
    stat = _stat(pid)
    return stat is not None and stat[0] != b"Z" and (started is None or stat[2] == started)


def _stop(known: dict[int, int | None], grace: float = 3.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [p for p, t in known.items() if _alive(p, t)]
        for p in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)
        deadline = time.monotonic() + grace
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [p for p in left if _alive(p, known[p])]


def watch_ray(driver: int, roots: Iterable[int]) -> subprocess.Popen:
    """Start the watchdog for the Ray processes ``roots`` that ``driver`` started."""
    return subprocess.Popen([sys.executable, "-c", _ENTRY, str(driver), *map(str, roots)],
                            stdin=subprocess.DEVNULL, start_new_session=True)


def main(argv: list[str] | None = None) -> None:
    """``DRIVER_PID ROOT_PID...``: follow the roots' tree until the driver exits, then
    stop what is left of it."""
    args = [int(a) for a in (sys.argv[1:] if argv is None else argv)]
    driver, roots = args[0], args[1:]
    driver_start = start_time(driver)
    known: dict[int, int | None] = {}
    while _alive(driver, driver_start):
        _subtree(roots, known)
        known = {p: t for p, t in known.items() if _alive(p, t)}
        time.sleep(0.5)
    _subtree(roots, known)
    _stop(known)


__all__ = ["children_of", "main", "process_tree", "watch_ray"]

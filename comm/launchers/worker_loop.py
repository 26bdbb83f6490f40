"""The worker side of the process launcher: a worker process's life, from entering its
network namespace to serving the driver's calls until :data:`CLOSE` (started by
:mod:`reshard.comm.launchers.spawn` in a forked or exec'd process; the driver side is
:mod:`reshard.comm.launchers.process`)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

from reshard.comm.calls import call_name
from reshard.comm.launchers.host import WorkerHost, WorkerSpec, portable_error
from reshard.comm.launchers.netns import enter_netns
from reshard.core.errors import ExecutionError

CLOSE = "__close__"
"""The message that ends a worker's loop."""


def _watch_parent(driver: int) -> None:
    """Exit when the driver (or the process that forked this one) dies, even by SIGKILL."""
    parent = os.getppid()  # the driver under spawn, the fork server under forkserver
    if parent != driver:  # the (single-threaded) fork server: die with it at once.
        # Not towards the driver: PR_SET_PDEATHSIG fires when the parent *thread* exits,
        # and any driver thread may have started this worker.
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except Exception:  # noqa: BLE001, S110 - best effort (the watcher also stops it)
            pass

    def poll() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            try:
                os.kill(driver, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass
            time.sleep(0.5)

    threading.Thread(target=poll, name="reshard-parent-watch", daemon=True).start()


PROFILE_ENV = "RESHARD_PROFILE"
"""A directory: each worker profiles its calls (cProfile) and writes them there when it
closes, ``worker-<device>.prof`` (read with ``python -m pstats``)."""


def _profiler(directory: str | None, device: int) -> Callable[[], None] | None:
    """Start profiling this process's calls into ``directory``; returns what stops it
    and writes the file (None: no directory given)."""
    if not directory:
        return None
    import cProfile

    prof = cProfile.Profile()
    prof.enable()

    def stop() -> None:
        prof.disable()
        os.makedirs(directory, exist_ok=True)
        prof.dump_stats(os.path.join(directory, f"worker-{device}.prof"))

    return stop


def _serve(host: WorkerHost, device: int, commands: Connection, results: Connection) -> None:
    """Answer the driver's calls in order until it says :data:`CLOSE` (or is gone)."""
    while True:
        # Read on this thread: a reader thread handing each call over cost two more
        # wake-ups a call (16 workers, a 16-byte execute: 92 -> 61 context switches,
        # 2-3% of its time on 2 cores). The driver's per-worker writer thread, not its
        # caller, waits when a busy worker's pipe is full; a driver that dies is noticed
        # by EOF here or by _watch_parent.
        try:
            msg = commands.recv()
        except (EOFError, OSError):
            os._exit(0)  # the driver is gone
        if msg == CLOSE:
            return
        call_id, call = msg
        try:
            reply = (call_id, True, host.call(call))
        except BaseException as e:  # noqa: BLE001 - the call's error is the reply
            reply = (call_id, False, portable_error(e, device))
        try:
            results.send(reply)
        except Exception as e:  # noqa: BLE001 - an unpicklable result
            results.send((call_id, False, ExecutionError(
                f"device {device}: {call_name(call)} returned an unsendable value: {e}")))


def worker_main(spec: WorkerSpec, commands: Connection, results: Connection,
                driver: int, driver_env: dict[str, str], netns: str | None = None) -> None:
    """Entry point of a worker process (in network namespace ``netns`` if given)."""
    if netns is not None:
        # First of all: setns moves only the calling thread, and threads started later
        # (gloo's, the store's, the pipe reader) inherit its namespace. A fork server's
        # child has no other thread yet; an exec'd worker may have numpy's OpenBLAS pool
        # (started by unpickling its arguments), which stays behind but opens no sockets.
        try:
            enter_netns(netns, sysfs=True)
        except BaseException as e:  # noqa: BLE001 - reported to the driver
            results.send(("failed", portable_error(e, spec.device), traceback.format_exc()))
            results.close()
            return
    # A fork server holds the driver's environment of when it started: take the
    # driver's current one, as spawn would, then the worker's own variables.
    os.environ.clear()
    os.environ.update(driver_env)
    os.environ.update(spec.env)
    # Ctrl-C in a terminal reaches the whole process group: the driver decides (it
    # closes the runtime on KeyboardInterrupt), workers ignore it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent(driver)
    try:
        host = WorkerHost(spec)
    except BaseException as e:  # noqa: BLE001 - report why, then exit
        results.send(("failed", portable_error(e, spec.device), traceback.format_exc()))
        results.close()
        return
    results.send(("ready", host.info()))

    profile = _profiler(os.environ.get(PROFILE_ENV), spec.device)
    _serve(host, spec.device, commands, results)
    if profile is not None:
        profile()
    try:
        host.close()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


__all__ = ["CLOSE", "PROFILE_ENV", "worker_main"]

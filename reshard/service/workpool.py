"""Expensive calls in processes of their own: stopped at the caller's deadline, capped in
memory, and few at a time, so that one request cannot take the server down.

A request whose size (:func:`reshard.service.budget.request_size`) says it is
expensive — planning, costing or verifying many tasks — runs as a job in one of
``size`` worker processes (started once, from a forkserver that imported reshard, and
reused). The serving thread waits for the answer until the call's deadline; then the
worker is killed (SIGKILL: its CPU stops at once, its memory goes back to the system),
a fresh one takes its place, and the call ends DEADLINE_EXCEEDED. A worker's address
space is capped (``RLIMIT_AS``): a job that needs more fails with a MemoryError there,
RESOURCE_EXHAUSTED for its caller, and the server does not notice; and it runs at a
lower CPU priority than the server (:data:`JOB_NICE`), so that cheap calls on the
serving threads are not slowed by the jobs on a busy machine. When every worker
is busy an expensive call is refused at once (RESOURCE_EXHAUSTED, retry later) rather
than queued, so at most ``size`` serving threads wait on jobs and cheap calls keep
flowing on the others. :meth:`WorkPool.close` (the server's drain) kills the workers,
so a stop is bounded by its grace whatever the jobs were doing.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import grpc

from reshard.errors import ReshardBaseError
from reshard.service.status import ServiceError

POLL = 0.02
"""Seconds between checks of a job's deadline while it runs."""

JOB_NICE = 5
"""How much lower a worker's CPU priority is than the server's (``nice``): the serving
threads' cheap calls get the cores first, the expensive jobs what is left (the server's
one process weighs 3x a worker; measured on 2 cores under 8 threads of 64-request
EstimateMany batches of 512-device moves, a good client's p99: nice 0 174-216 ms, nice 5
126-130 ms; nice 10 starved the jobs on a machine loaded by others)."""


def _serve(conn: Connection, memory_bytes: int) -> None:
    """A worker's loop: run each ``(function, args)`` received, send back
    ``("ok", result)`` or ``("error", exception)``."""
    import resource

    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    os.nice(JOB_NICE)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        fn, args = job
        try:
            out: tuple[str, Any] = ("ok", fn(*args))
        except MemoryError:
            out = ("memory", None)
        except SystemError as e:
            # an allocation refused under the cap, inside a C extension that returned
            # without raising (seen once in a clean-clone run, planning 512 devices)
            out = ("memory", None) if memory_bytes > 0 and _unraised(e) else \
                ("bug", f"{type(e).__name__}: {e}")
        except ReshardBaseError as e:
            out = ("error", e)
        except Exception as e:  # noqa: BLE001 - reported to the caller as text
            out = ("bug", f"{type(e).__name__}: {e}")
        try:
            conn.send(out)
        except MemoryError:
            conn.send(("memory", None))
        except Exception as e:  # noqa: BLE001 - e.g. an answer that does not pickle
            conn.send(("bug", f"cannot send the answer: {type(e).__name__}: {e}"))


def _unraised(e: SystemError) -> bool:
    """CPython's error for a C function that failed without setting an exception: in a
    worker whose address space is capped, an allocation the cap refused."""
    return "without exception set" in str(e)


class _Worker:
    """One worker process and the pipe to it."""

    def __init__(self, ctx: Any, memory_bytes: int) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, memory_bytes), daemon=True,
                                name="reshard-service-job")
        self.proc.start()
        child.close()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class WorkPool:
    """``size`` worker processes for expensive jobs (module docstring).

    Args:
        size: worker processes (jobs at once); 0 runs every job inline (no isolation).
        memory_bytes: each worker's address-space cap (0: none).
        preload: modules the forkserver imports once, before forking workers.
    """

    def __init__(self, size: int, memory_bytes: int,
                 preload: tuple[str, ...] = ("reshard.service.jobs",)) -> None:
        self.size = size
        self.memory_bytes = memory_bytes
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(preload))
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._closed = False
        self.killed = 0  # workers killed at a deadline or on close (for tests and logs)

    def start(self) -> None:
        """Start the workers now (the first job would otherwise wait for them)."""
        with self._lock:
            while len(self._idle) + len(self._busy) < self.size:
                self._idle.append(_Worker(self._ctx, self.memory_bytes))

    def free(self) -> bool:
        """Whether a job could start now (a worker idle or yet to start; always with
        no workers: jobs then run inline)."""
        with self._lock:
            return self.size == 0 or (not self._closed and (
                bool(self._idle) or len(self._busy) < self.size))

    def busy_error(self, what: str) -> ServiceError:
        """The refusal of a job while every worker is busy."""
        return ServiceError(
            f"{what}: all {self.size} workers for expensive requests are busy; "
            f"retry later (the server runs --job-workers of them at once)",
            grpc.StatusCode.RESOURCE_EXHAUSTED)

    def _take(self, what: str) -> _Worker:
        with self._lock:
            if self._closed:
                raise ServiceError("the server is shutting down; retry on another server",
                                   grpc.StatusCode.UNAVAILABLE)
            if not self._idle and len(self._busy) < self.size:
                self._idle.append(_Worker(self._ctx, self.memory_bytes))
            if not self._idle:
                raise self.busy_error(what)
            w = self._idle.pop()
            self._busy.add(w)
            return w

    def _give_back(self, w: _Worker, alive: bool) -> None:
        with self._lock:
            self._busy.discard(w)
            if alive and not self._closed:
                self._idle.append(w)
                return
        w.kill()
        self.killed += not alive

    def run(self, what: str, fn: Callable[..., Any], *args: Any,
            time_left: Callable[[], float | None] = lambda: None,
            active: Callable[[], bool] = lambda: True, cap: float | None = None) -> Any:
        """``fn(*args)`` in a worker; its answer, or its ReshardError raised here.

        Args:
            what: the call, for messages (``"Estimate"``).
            fn: a module-level function (it travels by name).
            args: its arguments (picklable).
            time_left: seconds left to the caller's deadline (None: none).
            active: whether the caller still waits (False once it cancelled).
            cap: the most seconds a job may take whatever its deadline (None: no cap).

        Raises:
            ServiceError: every worker busy (RESOURCE_EXHAUSTED), the deadline or the cap
                passed (DEADLINE_EXCEEDED), the caller cancelled (CANCELLED), the job ran
                out of memory (RESOURCE_EXHAUSTED), or the server is stopping
                (UNAVAILABLE); in each but the last, the worker was killed (a new one
                takes its place), so the pool is free for the next request at once.
            ReshardError: the job's own (bad input), as raised there.
        """
        if self.size == 0:
            return fn(*args)
        w = self._take(what)
        alive = False
        start = time.monotonic()
        try:
            w.conn.send((fn, args))
            while not w.conn.poll(POLL):
                self._check_waiting(what, w, time_left(), active(),
                                    None if cap is None else (cap, time.monotonic() - start))
            try:
                status, value = w.conn.recv()
            except (EOFError, OSError):
                raise ServiceError(f"{what}: the worker doing the request died (exit code "
                                   f"{w.proc.exitcode})",
                                   grpc.StatusCode.RESOURCE_EXHAUSTED) from None
            alive = True
        finally:
            self._give_back(w, alive)
        if status == "ok":
            return value
        if status == "error":
            raise value
        if status == "memory":
            raise ServiceError(
                f"{what}: the request needs more memory than a worker may use "
                f"({self.memory_bytes >> 20} MiB, --job-memory-mb); ask for less "
                f"(fewer devices or tensors per request)", grpc.StatusCode.RESOURCE_EXHAUSTED)
        raise ServiceError(f"{what}: internal error in the worker: {value}",
                           grpc.StatusCode.INTERNAL)

    def _check_waiting(self, what: str, w: _Worker, left: float | None, active: bool,
                       capped: tuple[float, float] | None) -> None:
        """Raise the ServiceError that stops a job the caller should wait on no longer:
        the server stopping, the deadline passed (``left``), the caller gone
        (``active``), the cap exceeded (``capped``: the cap and the seconds spent), or
        the worker dead."""
        if self._closed:
            raise ServiceError(f"{what}: the server is shutting down; the request "
                               f"was stopped", grpc.StatusCode.UNAVAILABLE)
        if left is not None and left <= 0:
            raise ServiceError(f"{what}: the call's deadline passed before the "
                               f"request's work was done; it was stopped",
                               grpc.StatusCode.DEADLINE_EXCEEDED)
        if not active:
            raise ServiceError(f"{what}: the caller cancelled the call; its work "
                               f"was stopped", grpc.StatusCode.CANCELLED)
        if capped is not None and capped[1] > capped[0]:
            raise ServiceError(
                f"{what}: the request's work ran past the server's cap of {capped[0]:g} s "
                f"(--job-timeout); it was stopped: ask for less, or run it in "
                f"process (reshard.plan)", grpc.StatusCode.DEADLINE_EXCEEDED)
        if not w.proc.is_alive():
            raise ServiceError(f"{what}: the worker doing the request died "
                               f"(exit code {w.proc.exitcode})",
                               grpc.StatusCode.RESOURCE_EXHAUSTED)

    def close(self) -> None:
        """Kill every worker (idempotent); jobs in flight end UNAVAILABLE."""
        with self._lock:  # who closes a pipe is decided here, once: idle ones here,
            self._closed = True  # busy ones by their caller (_give_back), never both
            idle, busy = self._idle, list(self._busy)
            self._idle = []
        deadline = time.monotonic() + 5
        for w in idle + busy:
            if w.proc.is_alive():
                w.proc.kill()
        for w in idle + busy:
            w.proc.join(max(0.0, deadline - time.monotonic()))
        for w in idle:
            w.conn.close()

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids."""
        with self._lock:
            return [w.proc.pid for w in self._idle + list(self._busy) if w.proc.pid]


__all__ = ["WorkPool"]

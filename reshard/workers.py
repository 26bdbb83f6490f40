"""A Runtime's workers: calls issued in one global order, waited on with a progress
timeout, and the failure rule (a dead or stuck worker shuts them all down, with one
error naming devices and tasks: :mod:`reshard.diagnosis`)."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING, Any

from reshard.comm.calls import WorkerCall
from reshard.core.errors import ExecutionError, ReshardError
from reshard.diagnosis import DEATH_NOTICE, REPORT_GRACE, collect_reports, deaths, describe_failure

if TYPE_CHECKING:
    from reshard.planner.ir import ReshardPlan

Issued = list[tuple[int, Future]]
"""Calls on their way: ``(device, future)`` each."""

ABORT_WAIT = 15.0
"""Seconds :meth:`Workers.close` waits for a failure's shutdown (killing the workers
takes about a second; the rest releases pipes and the rendezvous): past it, close
returns rather than hang the caller (or the interpreter's exit) on a stuck thread."""


class _Interrupt:
    """A SIGINT handler that only records the signal (see :func:`interrupts_deferred`)."""

    def __init__(self) -> None:
        self.hit = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.hit = True


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[_Interrupt | None]:
    """Ctrl-C inside the block is recorded, not raised where it lands: the caller
    checks ``hit`` at points where raising is safe. Python raises KeyboardInterrupt
    between any two bytecodes, also inside ``threading.Condition.__enter__`` after its
    lock is taken (a future's lock, a waiter's event), and a lock left held that way
    hung the shutdown that followed for ever (issue 61, item 12). Only in the main
    thread and only over Python's own default handler (a caller's handler is left
    alone: None is yielded)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield None
        return
    box = _Interrupt()
    old = signal.signal(signal.SIGINT, box)
    try:
        yield box
    finally:
        signal.signal(signal.SIGINT, old)


class Workers:
    """One worker per device, started by a launcher (``group``), and the calls made on
    them.

    Callers issue calls under :attr:`lock` (every worker then receives every call in
    one global order) and wait for them outside it (:meth:`wait`). A call that fails,
    a worker that dies, or one that makes no progress (finishes no call) for
    ``timeout`` seconds fails the whole group: it records why, stops every worker in
    the background, and every later call raises one :class:`ExecutionError`.
    """

    def __init__(self, group: Any, timeout: float) -> None:
        self.group = group
        self.timeout = timeout
        self.lock = threading.RLock()  # one global order of calls
        self._progress: dict[int, float] = {}  # device -> when it last finished a call
        self.closed = False
        self.broken: str | None = None
        self._aborting: threading.Thread | None = None

    def close(self, grace: float | None = None) -> None:
        """Stop every worker (idempotent; after a failure, wait until they are gone)."""
        with self.lock:
            closing = not self.closed
            self.closed = True
        if closing:
            self.group.close(grace)
        aborting = self._aborting
        if aborting is not None and aborting is not threading.current_thread():
            aborting.join(ABORT_WAIT)

    def check_open(self) -> None:
        """Raise unless calls may be made (a failure also closes the group)."""
        if self.broken:  # checked first
            raise ExecutionError(
                f"this Runtime failed earlier and was shut down: {self.broken}")
        if self.closed:
            raise ReshardError("this Runtime is closed; create a new one")

    def ensure(self, devices: Sequence[int]) -> None:
        """Start the workers of ``devices`` where the launcher starts them on demand."""
        self.group.ensure(devices)

    def issue(self, calls: dict[int, WorkerCall]) -> Issued:
        """Issue ``{device: call}`` (the caller holds :attr:`lock`): to every device or,
        interrupted (Ctrl-C), to every device and then the group is shut down (a call
        issued to some devices only would leave the others' order behind)."""
        out = []
        with interrupts_deferred() as interrupt:
            for d, call in calls.items():
                fut = self.group.submit(d, call)
                fut.add_done_callback(functools.partial(self._made_progress, d))
                out.append((d, fut))
        if interrupt is not None and interrupt.hit:
            self.fail("issuing calls was interrupted")
            raise KeyboardInterrupt
        return out

    def _made_progress(self, device: int, _: Future) -> None:
        """A call of ``device`` finished: it is alive and moving."""
        self._progress[device] = time.monotonic()

    def call(self, calls: dict[int, WorkerCall], what: str) -> dict[int, Any]:
        """Issue ``{device: call}`` and wait; returns ``{device: result}``."""
        with self.lock:
            self.check_open()
            issued = time.monotonic()
            futures = self.issue(calls)
        self.wait(futures, what, issued)
        return {d: f.result() for d, f in futures}

    def wait(self, calls: Issued, what: str, issued: float, timeout: float | None = None,
             plan: ReshardPlan | None = None) -> None:
        """Wait for issued calls; on failure shut down and raise one error naming the
        dead or stuck devices and the failing tasks (``timeout``: this call's, default
        the group's; ``plan``: the plan being executed, whose tasks a dead device took
        part in are named too, whether or not a peer reported one)."""
        limit = self.timeout if timeout is None else timeout
        with interrupts_deferred() as interrupt:
            self._wait(calls, what, issued, limit, timeout, plan, interrupt)
        if interrupt is not None and interrupt.hit:
            raise KeyboardInterrupt  # it came as the calls finished: they are whole

    def _wait(self, calls: Issued, what: str, issued: float, limit: float,
              timeout: float | None, plan: ReshardPlan | None,
              interrupt: _Interrupt | None) -> None:
        pending = {f for _, f in calls}
        while pending:
            try:
                if interrupt is not None and interrupt.hit:
                    raise KeyboardInterrupt
                done, pending = wait(pending, timeout=0.1, return_when="FIRST_EXCEPTION")
            except KeyboardInterrupt:
                # Workers may be mid-plan: their state is unknown, so stop them.
                self.fail(f"{what} was interrupted")
                raise
            if self.broken:  # another thread's call failed and shut the group down
                raise ExecutionError(f"this Runtime failed and was shut down: {self.broken}")
            failed = any(f.exception() is not None for f in done)
            dead = self.group.dead()
            now = time.monotonic()
            stuck = sorted({d for d, f in calls if not f.done() and
                            now - max(issued, self._progress.get(d, 0.0)) >= limit})
            if failed or dead or stuck:
                reason = self._diagnose(calls, what, dead, stuck, limit, timeout, plan)
                self.fail(reason)
                raise ExecutionError(reason)

    def _diagnose(self, calls: Issued, what: str, dead: dict[int, str], stuck: list[int],
                  limit: float, timeout: float | None, plan: ReshardPlan | None) -> str:
        """Why the calls failed: the peers' reports, the dead (``dead``: those the
        group saw dead already) and the silent devices."""
        # a call with a deadline of its own (a service caller's) must answer inside it:
        # peers get a twentieth of it to report, not a second
        grace = REPORT_GRACE if timeout is None else min(REPORT_GRACE, max(0.02, timeout / 20))
        collect_reports({f for d, f in calls if d not in dead and not f.done()}, grace)
        dead = deaths(self.group, calls, min(grace, DEATH_NOTICE))  # also while reporting
        silent = sorted({d for d, f in calls if not f.done() and d not in dead})
        return describe_failure(calls, what, silent if stuck else [], dead, limit, plan)

    def fail(self, reason: str) -> None:
        """Record why, and stop every worker now (their state is unknown), in the
        background so that the error is raised at once; :meth:`close` waits for it."""
        with self.lock:
            if self.broken is None:
                self.broken = reason
            if self.closed:
                return
            self.closed = True
            self._aborting = threading.Thread(target=self.group.abort, daemon=True,
                                              name="reshard-abort")
            self._aborting.start()


__all__ = ["Issued", "Workers"]

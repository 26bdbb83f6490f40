"""Undo what a run built on this machine also when it ends badly: at interpreter exit and
on SIGTERM / SIGHUP.

An :class:`ExitGuard` belongs to one resource (a testbed, a Ray cluster on it) and is
armed when that resource is built, not at import: :meth:`ExitGuard.arm` registers the
resource's ``close`` with :mod:`atexit` and, in the main thread, turns SIGTERM and
SIGHUP into ``SystemExit(128 + signum)`` so that every ``with`` block and ``finally``
unwinds (closing what it opened) before the interpreter's exit handlers run.
:meth:`ExitGuard.disarm` undoes both once the resource is closed.

Handlers chain instead of living in a module-level registry: a guard installs itself
only over the default action or over another guard (never over a handler the program
set), remembers what it replaced and puts it back when it is disarmed while on top. A
guard disarmed while another sits above it stays in the chain as a pass-through that
behaves like what it replaced (the default action is re-raised as such), and is
unlinked once the guards above it are gone. The first signal resets every guarded
signal to its default action, so a second one kills as usual.

:class:`Guarded` is the lifecycle such a resource shares: built new, started once,
closed once, its guard armed from the start on.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Self

GUARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class ExitGuard:
    """Close one resource at interpreter exit, and on SIGTERM / SIGHUP through
    ``SystemExit``, while it is armed.

    Args:
        close: undoes the resource; idempotent (it may run from ``__exit__`` and from
            :mod:`atexit` both).
        name: what the resource is, for ``repr``.
    """

    def __init__(self, close: Callable[[], None], name: str = "") -> None:
        self._close = close
        self.name = name
        self._armed = False
        self._previous: dict[int, Any] = {}  # signal -> the handler this guard replaced
        self._lock = threading.Lock()

    @property
    def armed(self) -> bool:
        """True between :meth:`arm` and :meth:`disarm`."""
        return self._armed

    def arm(self) -> None:
        """Register ``close`` at exit and, in the main thread, the signal handlers."""
        with self._lock:
            if self._armed:
                return
            self._armed = True
            atexit.register(self._at_exit)
            if threading.current_thread() is not threading.main_thread():
                return  # signal.signal works in the main thread only
            for sig in GUARDED_SIGNALS:
                current = signal.getsignal(sig)
                if current is signal.SIG_DFL or isinstance(current, ExitGuard):
                    self._previous[sig] = current
                    signal.signal(sig, self)

    def disarm(self) -> None:
        """Unregister ``close`` and take this guard's handlers out of the chain where
        it is on top (else it stays as a pass-through until those above are gone)."""
        with self._lock:
            if not self._armed:
                return
            self._armed = False
            atexit.unregister(self._at_exit)
            if threading.current_thread() is not threading.main_thread():
                return
            for sig in list(self._previous):
                _unlink_top(sig)

    def reclaim(self) -> None:
        """Put this guard back on top of the signals it guards after code that replaced
        its handlers (``ray.init`` installs a SIGTERM handler of its own in Python, and
        a C-level failure handler that aborts without unwinding): what replaced it
        becomes the handler this guard restores when it is disarmed."""
        with self._lock:
            if not self._armed or threading.current_thread() is not threading.main_thread():
                return
            for sig in list(self._previous):
                current = signal.getsignal(sig)
                if current is not self:
                    self._previous[sig] = current
                signal.signal(sig, self)  # also resets a C-level handler set behind Python

    def _at_exit(self) -> None:
        with contextlib.suppress(Exception):  # at exit nothing can handle it
            self._close()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: unwind as ``SystemExit`` while armed, else behave like
        the handler this guard replaced."""
        if self._armed:
            for sig in GUARDED_SIGNALS:  # a second signal kills as usual
                if isinstance(signal.getsignal(sig), ExitGuard):
                    signal.signal(sig, signal.SIG_DFL)
            raise SystemExit(128 + signum)
        previous = self._previous.get(signum, signal.SIG_DFL)
        if isinstance(previous, ExitGuard):
            previous(signum, frame)
        elif previous is signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        elif callable(previous):
            previous(signum, frame)

    def __repr__(self) -> str:
        return f"ExitGuard({self.name or self._close!r}, armed={self._armed})"


class Guarded:
    """A resource started once and then closed (new, running, closed), with an
    :class:`ExitGuard` that closes it at exit and on SIGTERM / SIGHUP from its start on;
    a ``with`` block starts and closes it. A subclass's ``start`` refuses a second start
    and calls :meth:`_begin` before it builds anything; its ``close``, holding
    ``_lock``, returns where :meth:`_nothing_to_close`, and disarms ``_guard`` when done.

    Args:
        name: what the resource is, for its guard's ``repr``.
    """

    def __init__(self, name: str) -> None:
        self._started = False
        self._closed = False
        self._lock = threading.Lock()
        self._guard = ExitGuard(self.close, name)

    def start(self) -> object:
        """Build the resource (a subclass's)."""
        raise NotImplementedError

    def close(self) -> None:
        """Undo what :meth:`start` built (a subclass's; idempotent)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _begin(self) -> None:
        """Mark the resource started and arm its guard: close at exit and on SIGTERM /
        SIGHUP from now on."""
        self._started = True
        self._guard.arm()

    def _nothing_to_close(self) -> bool:
        """(Under ``_lock``.) True where the resource never started or is closed
        already, marking it closed: its ``close`` has nothing to undo."""
        if self._closed or not self._started:
            self._closed = True
            return True
        return False

    def _state(self) -> str:
        """``new``, ``running`` or ``closed``, for ``repr``."""
        return "closed" if self._closed else "running" if self._started else "new"


def _unlink_top(sig: int) -> None:
    """Pop disarmed guards off the top of ``sig``'s handler chain."""
    current = signal.getsignal(sig)
    while isinstance(current, ExitGuard) and not current.armed:
        current = current._previous.pop(sig, signal.SIG_DFL)
        signal.signal(sig, current)


__all__ = ["GUARDED_SIGNALS", "ExitGuard", "Guarded"]

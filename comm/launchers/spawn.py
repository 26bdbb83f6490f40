"""Starting worker processes from reshard's own entry point, never the caller's script.

multiprocessing's ``spawn`` and ``forkserver`` methods re-run the parent's main module
in every child, so a script without ``if __name__ == "__main__":`` that creates a
Runtime starts a Runtime in each of its workers (hundreds of lines of tracebacks).
Workers started here run :mod:`reshard.comm.launchers.worker_main` only, as torchrun
and Ray start theirs; nothing of the caller's ``__main__`` is imported, so anything a
worker must build (pipeline stage classes, extensions) is named by import path.

Two starters, one :class:`WorkerProcess` handle:

* :class:`ForkServer` (default): one server per worker group, started fresh (exec),
  imports the backend's modules once (torch for gloo), then forks each worker on
  request. 8 gloo workers start in about the time of one torch import instead of
  eight at once. The server never starts threads, gloo or CUDA, so forking it is as
  safe as ``spawn``. It dies with its driver and reaps its children, reporting each
  exit status through a per-worker status pipe, which is also the worker's sentinel.
* :class:`ExecStarter` (``RESHARD_START_METHOD=spawn``): every worker a fresh
  interpreter of its own (slower start, nothing shared).

Each worker gets two pipes, commands in and results out
(:class:`multiprocessing.connection.Connection` on both ends); the first command is
its :class:`WorkerArgs`.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol

from reshard.comm.launchers.host import describe_exit
from reshard.core.errors import ExecutionError

_ENTRY = "from reshard.comm.launchers.worker_main import main; main()"
_PID = struct.Struct("!q")
_CODE = struct.Struct("!i")
_UNKNOWN = object()


@dataclass(frozen=True)
class WorkerArgs:
    """What a worker process needs, sent as its first command.

    Attributes:
        spec: the worker's :class:`~reshard.comm.launchers.host.WorkerSpec`.
        driver: the driver's pid (the worker exits when it is gone).
        driver_env: the driver's environment (applied before ``spec.env``).
        netns: network namespace to enter first, or None.
    """

    spec: Any
    driver: int
    driver_env: Mapping[str, str]
    netns: str | None = None


def _python_path() -> str:
    """The driver's import path, so workers resolve reshard (and the user's named
    modules) exactly as the driver does."""
    return os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))


def _fork_safe_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = _python_path()
    return env


class WorkerProcess:
    """Driver-side handle of one worker process (the API of ``multiprocessing.Process``
    that the launcher uses).

    Attributes:
        pid: the worker's process id.
        sentinel: a file descriptor that becomes readable once the process has exited.
    """

    def __init__(self, pid: int, sentinel: int) -> None:
        self.pid = pid
        self.sentinel = sentinel
        self._code: Any = None  # None: running; _UNKNOWN: gone, status unknown
        self._closed = False

    def _poll(self) -> Any:
        """Exit status if known now (subclasses)."""
        raise NotImplementedError

    @property
    def exitcode(self) -> int | None:
        """Exit status (negative: killed by that signal); None while running or unknown."""
        if self._code is None:
            self._code = self._poll()
        return None if self._code is _UNKNOWN else self._code

    def describe(self) -> str:
        """How the process ended, in words."""
        code = self.exitcode
        if self._code is _UNKNOWN:
            return "ended (its fork server is gone, exit status unknown)"
        return describe_exit(code)

    def is_alive(self) -> bool:
        """True until the process has exited."""
        if self._code is not None:
            return False
        self._code = self._poll()
        return self._code is None

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for the process to exit."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_alive():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            select.select([self.sentinel], [], [], min(0.1, left) if left is not None else 0.1)

    def _signal(self, sig: int) -> None:
        if self.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        """SIGTERM."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self._signal(signal.SIGKILL)

    def close(self) -> None:
        """Release the sentinel (idempotent)."""
        if not self._closed:
            self._closed = True
            os.close(self.sentinel)


class _ForkedProcess(WorkerProcess):
    """A fork server's child: the server writes its exit status into the status pipe
    (the sentinel) when it reaps it."""

    def _poll(self) -> Any:
        if self._closed or not select.select([self.sentinel], [], [], 0)[0]:
            return None
        raw = b""
        while len(raw) < _CODE.size:
            chunk = os.read(self.sentinel, _CODE.size - len(raw))
            if not chunk:
                return _UNKNOWN
            raw += chunk
        return _CODE.unpack(raw)[0]


class _ExecProcess(WorkerProcess):
    """A worker exec'd directly: it holds the write end of a pipe until it exits."""

    def __init__(self, popen: subprocess.Popen, sentinel: int) -> None:
        super().__init__(popen.pid, sentinel)
        self.popen = popen

    def _poll(self) -> Any:
        code = self.popen.poll()
        return code


class Starter(Protocol):
    """Starts worker processes."""

    def start(self, args: WorkerArgs) -> tuple[WorkerProcess, Connection, Connection]:
        """Start one worker; returns its handle, its commands (write) and results (read)
        connections; ``args`` is already sent."""

    def close(self) -> None:
        """Release what the starter holds (its workers are the caller's to stop)."""


def _pipes() -> tuple[tuple[int, int], tuple[int, int]]:
    return os.pipe(), os.pipe()


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


class ForkServer:
    """A fork server for one worker group (see the module docstring).

    Args:
        preload: modules the server imports once, before it forks anything.
        timeout: seconds to wait for the server to come up.
    """

    def __init__(self, preload: Sequence[str], timeout: float = 120.0) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = ours
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _ENTRY, "serve", str(theirs.fileno()), str(os.getpid()),
                 *preload],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=_fork_safe_env())
        finally:
            theirs.close()
        ours.settimeout(timeout)
        try:
            ready = ours.recv(1)
        except OSError as e:
            ready = b""
            why = f"{type(e).__name__}: {e}"
        else:
            why = "it exited" if not ready else ""
        if ready != b"R":
            self.close()
            raise ExecutionError(f"the reshard fork server did not start ({why}); its "
                                 f"errors are above on stderr")
        ours.settimeout(None)

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self._proc.pid

    def start(self, args: WorkerArgs) -> tuple[WorkerProcess, Connection, Connection]:
        """Fork one worker (see :meth:`Starter.start`)."""
        (cmd_r, cmd_w), (res_r, res_w) = _pipes()
        status_r, status_w = os.pipe()
        try:
            socket.send_fds(self._sock, [b"F"], [cmd_r, res_w, status_w])
            raw = b""
            while len(raw) < _PID.size:
                chunk = self._sock.recv(_PID.size - len(raw))
                if not chunk:
                    raise ExecutionError("the reshard fork server died while starting a worker")
                raw += chunk
        except OSError as e:
            _close(cmd_w, res_r, status_r)
            raise ExecutionError(f"the reshard fork server is gone: {e}") from e
        finally:
            _close(cmd_r, res_w, status_w)  # the server holds its own copies now
        proc = _ForkedProcess(_PID.unpack(raw)[0], status_r)
        commands = Connection(cmd_w, readable=False)
        results = Connection(res_r, writable=False)
        commands.send(args)
        return proc, commands, results

    def close(self) -> None:
        """Stop the server (idempotent): it exits when its control socket closes."""
        with contextlib.suppress(OSError):
            self._sock.close()
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)


class ExecStarter:
    """Every worker a fresh interpreter (``RESHARD_START_METHOD=spawn``)."""

    def start(self, args: WorkerArgs) -> tuple[WorkerProcess, Connection, Connection]:
        """Exec one worker (see :meth:`Starter.start`)."""
        (cmd_r, cmd_w), (res_r, res_w) = _pipes()
        life_r, life_w = os.pipe()
        try:
            popen = subprocess.Popen(
                [sys.executable, "-c", _ENTRY, "run", str(cmd_r), str(res_w)],
                pass_fds=(cmd_r, res_w, life_w), stdin=subprocess.DEVNULL,
                env=_fork_safe_env())
        except OSError as e:
            _close(cmd_w, res_r, life_r)
            raise ExecutionError(f"cannot start a worker process: {e}") from e
        finally:
            _close(cmd_r, res_w, life_w)  # the child holds its own copies now
        commands = Connection(cmd_w, readable=False)
        commands.send(args)
        return _ExecProcess(popen, life_r), commands, Connection(res_r, writable=False)

    def close(self) -> None:
        """Nothing shared to release."""


# ----- the server's side -----------------------------------------------------------------
def _watch_driver(driver: int, sock: socket.socket) -> bool:
    """False once the driver is gone. Its death also closes the control socket (EOF),
    which ends the loop; this covers a socket some other process still holds.
    (No PR_SET_PDEATHSIG here: it fires when the driver *thread* that started the
    server exits, and any thread of the driver may start a Runtime.)"""
    try:
        os.kill(driver, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def serve(control_fd: int, driver: int, preload: Sequence[str]) -> None:
    """The fork server's loop: import ``preload``, say ready, fork a worker per request,
    reap children and report their exit status; exit when the driver closes the socket."""
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    for name in preload:
        # a missing package: the worker reports it when its backend starts
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    sock = socket.socket(fileno=control_fd)
    sock.sendall(b"R")
    children: dict[int, int] = {}  # pid -> write end of its status pipe
    while _watch_driver(driver, sock):
        readable, _, _ = select.select([sock], [], [], 0.2)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            fd = children.pop(pid, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.write(fd, _CODE.pack(os.waitstatus_to_exitcode(status)))
                os.close(fd)
        if not readable:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1, 3)
        except OSError:
            msg, fds = b"", []
        if not msg:
            for fd in fds:
                os.close(fd)
            return  # the driver is gone or done: children die with us (PDEATHSIG)
        cmd_r, res_w, status_w = fds
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                os.close(status_w)
                for fd in children.values():
                    os.close(fd)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                run(cmd_r, res_w)
            finally:
                os._exit(1)
        children[pid] = status_w
        os.close(cmd_r)
        os.close(res_w)
        sock.sendall(_PID.pack(pid))


def run(cmd_fd: int, res_fd: int) -> None:
    """A worker's life: read its :class:`WorkerArgs`, then serve commands (never returns
    normally: the worker loop ends the process)."""
    from reshard.comm.launchers.worker_loop import worker_main

    commands = Connection(cmd_fd, writable=False)
    results = Connection(res_fd, readable=False)
    try:
        args = commands.recv()
    except (EOFError, OSError, pickle.UnpicklingError):
        os._exit(1)
    worker_main(args.spec, commands, results, args.driver, dict(args.driver_env), args.netns)


__all__ = ["ExecStarter", "ForkServer", "Starter", "WorkerArgs", "WorkerProcess", "run",
           "serve"]

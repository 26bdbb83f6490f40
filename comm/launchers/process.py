"""Process launcher: one plain local process per device.

Workers start from reshard's own entry point (:mod:`reshard.comm.launchers.spawn`),
never from the caller's ``__main__``, so a script needs no ``if __name__ ==
"__main__":`` guard. By default a fork server per worker group, started fresh (exec),
imports torch once and forks each worker from there; it never initialises gloo, CUDA
or threads of its own, which makes it as safe as ``spawn`` and starts 8 gloo workers
in about one torch import instead of eight at once on 2 cores. ``RESHARD_START_METHOD=
spawn`` in the driver's environment execs every worker instead. Never ``fork`` the
driver: torch, gloo and its threads do not survive it.

Each worker process runs :func:`worker_main`: it applies its environment, joins the
backend's world (:class:`~reshard.comm.launchers.host.WorkerHost`), reports ready,
then serves ``(call_id, method, args)`` commands from a pipe one at a time and sends
back ``(call_id, ok, result-or-exception)``.

Driver side, a command goes down its worker's pipe on the submitting thread where
that cannot block (a small command, nothing queued before it, room in the pipe), else a
per-worker writer thread drains a queue into the pipe (so a submit never blocks on a
busy or stopped worker); either way in submission order. One monitor thread waits on
every result pipe and every process sentinel: it resolves futures, and when a
process exits it records why and fails that worker's pending calls at once.

Network namespaces (the emulated multi-host testbed, :mod:`reshard.testbed`):
given a :class:`NetnsPlacement`, each worker enters its cluster host's namespace
(``setns``) as the very first thing it does, before it starts any thread, so every
socket it and its backend open lives there; gloo binds to the namespace's interface
(``GLOO_SOCKET_IFNAME``) and advertises its address, and the driver's rendezvous
listens on the driver's address on the namespaces' network instead of loopback.

Cleanup: :meth:`ProcessGroup.close` asks workers to exit, then terminates and
kills what remains, then stops the fork server; it also runs at interpreter exit.
Workers watch the driver (``PR_SET_PDEATHSIG`` towards the fork server, which itself
dies with the driver, and a thread polling the parent and the driver's pid) and exit
when the driver's pipe closes, so they do not outlive a driver that is killed.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import multiprocessing as mp
import os
import queue
import select
import selectors
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any

from reshard.comm.backend import BackendKind
from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer
from reshard.comm.calls import call_name
from reshard.comm.launchers.base import require_workers
from reshard.comm.launchers.cleanup import close_at_exit
from reshard.comm.launchers.host import WorkerSpec, make_specs
from reshard.comm.launchers.netns import (
    NETNS_DIR,
    NetnsHost,
    NetnsPlacement,
    Placement,
    as_placement,
    enter_netns,
)
from reshard.comm.launchers.spawn import ExecStarter, ForkServer, Starter, WorkerArgs
from reshard.comm.launchers.worker_loop import CLOSE
from reshard.core.cluster import Cluster
from reshard.core.errors import ExecutionError

if TYPE_CHECKING:
    from reshard.comm.calls import WorkerCall

_GRACE = 3.0  # seconds a worker gets to exit on its own at close


# ----- driver side -------------------------------------------------------------------
_DIRECT = select.PIPE_BUF - 4
"""Pickled commands up to this size (a pipe's atomic write, ``PIPE_BUF``, less the
connection's 4-byte length) go down the pipe on the submitting thread when nothing is
queued before them and the pipe has a free page: such a write never blocks."""


class _Worker:
    """Driver-side handle of one worker process.

    A command goes down its pipe on the caller's thread when that cannot block (small,
    nothing queued before it, room in the pipe), else through the writer thread, in
    submission order either way: handing each command to the writer cost a thread
    wake-up per worker and call (16 workers per execute)."""

    def __init__(self, spec: WorkerSpec, process: Any, commands: Connection,
                 results: Connection) -> None:
        self.spec = spec
        self.device = spec.device
        self.process = process
        self.commands = commands
        self.results = results
        self.pending: dict[int, Future] = {}
        self.outbox: queue.Queue = queue.Queue()
        self.queued = 0  # commands handed to the writer and not yet written
        self.posting = threading.Lock()  # orders posts, guards ``queued``
        self.room = select.poll()
        self.room.register(commands.fileno(), select.POLLOUT)
        self.dead: str | None = None
        self.pid: int | None = process.pid
        self.writer = threading.Thread(target=self._write, daemon=True,
                                       name=f"reshard-send-dev{self.device}")

    def post(self, call_id: int | None, what: str, data: bytes) -> None:
        """Send pickled command ``data`` (call ``call_id``, None for :data:`CLOSE`; ``what``
        names it in an error): at once where that cannot block, else by the writer."""
        with self.posting:
            if not self.queued and len(data) <= _DIRECT and self.room.poll(0):
                self._send(call_id, what, data)
                return
            self.queued += 1
            self.outbox.put((call_id, what, data))

    def stop_writer(self) -> None:
        """The writer thread ends after what is queued."""
        self.outbox.put(None)

    def _write(self) -> None:
        while True:
            item = self.outbox.get()
            if item is None:
                return
            self._send(*item)
            with self.posting:
                self.queued -= 1

    def _send(self, call_id: int | None, what: str, data: bytes) -> None:
        try:
            self.commands.send_bytes(data)
        except Exception as e:  # noqa: BLE001 - fails the call's future
            if call_id is None:
                return
            fut = self.pending.pop(call_id, None)
            if fut is not None and not fut.done():
                fut.set_exception(ExecutionError(
                    f"device {self.device}: cannot send {what} to the worker: "
                    f"{type(e).__name__}: {e}"))


class ProcessGroup:
    """Workers as local processes, one per device.

    Args:
        backend: ``gloo``, ``tcp`` or ``nccl``.
        devices: devices to start workers for.
        cluster: maps devices to hosts (for per-host GPU indices and ``{host}``).
        timeout: seconds any blocking operation may wait; start-up may take this plus
            a minute for the workers to import torch / cupy.
        env: extra environment variables for the workers (``{device}``, ``{rank}``,
            ``{host}`` in values are replaced per worker).
        netns: run each worker in its cluster host's network namespace: a
            :class:`NetnsPlacement` or an object with ``netns_placement()`` (a
            :class:`~reshard.testbed.Testbed`). gloo and tcp only. The rendezvous
            then listens on the placement's driver address instead of loopback.
    """

    def __init__(self, backend: BackendKind, devices: Sequence[int], cluster: Cluster | None,
                 timeout: float, env: dict[str, str] | None = None,
                 netns: Placement | None = None) -> None:
        self.backend = BackendKind.parse(backend)
        self.timeout = float(timeout)
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._workers: dict[int, _Worker] = {}
        placement = None if netns is None else as_placement(netns)
        if placement is not None and not self.backend.advertises:
            able = [k.value for k in BackendKind if k.advertises]
            raise ExecutionError(
                f"network namespaces (netns=...) are supported for the backends that talk "
                f"over a host's network ({', '.join(able)}), not {self.backend.value!r}")
        self.placement = placement
        # One connection per worker; room for as many again (a restarted channel).
        self.rendezvous = TcpRendezvousServer(
            "127.0.0.1" if placement is None else placement.driver_address,
            max_clients=2 * len(devices) + 8)
        self._wake_r, self._wake_w = mp.Pipe(duplex=False)
        self._monitor: threading.Thread | None = None
        self.spawner: Starter | None = None
        self._atexit = close_at_exit(self)
        try:
            specs = make_specs(self.backend.value, devices, cluster, self.timeout,
                               self.rendezvous.address, env,
                               {"advertise": "127.0.0.1"}
                               if self.backend.advertises else {})
            where: Mapping[int, str | None] = {s.device: None for s in specs}
            if placement is not None:
                where = {s.device: placement.host(s.host).netns for s in specs}
                specs = [placement.apply(s) for s in specs]
            self._start(specs, where)
        except BaseException:
            self.close()
            raise

    # ----- start-up ------------------------------------------------------------------
    def _starter(self) -> Starter:
        method = os.environ.get("RESHARD_START_METHOD", "").strip().lower() or "forkserver"
        if method == "spawn":
            return ExecStarter()
        if method != "forkserver":
            raise ExecutionError(
                f"RESHARD_START_METHOD={method!r} is not supported; use 'forkserver' or "
                f"'spawn' (never 'fork': torch, gloo and the driver's threads do not "
                f"survive it)")
        # imported once by the fork server, then inherited by every worker it forks:
        # importing torch in 8 processes at once on 2 cores takes ~20 s, forking a
        # server that has it ~0.1 s (the registry's preload list)
        return ForkServer(list(self.backend.entry.preload), self.timeout + 60.0)

    def _start(self, specs: list[WorkerSpec], netns: Mapping[int, str | None]) -> None:
        self.spawner = self._starter()
        env = dict(os.environ)
        for spec in specs:
            proc, cmd_w, res_r = self.spawner.start(
                WorkerArgs(spec, os.getpid(), env, netns[spec.device]))
            self._workers[spec.device] = _Worker(spec, proc, cmd_w, res_r)
        deadline = time.monotonic() + self.timeout + 60.0
        waiting = {w.results: w for w in self._workers.values()}
        problems: list[str] = []
        while waiting and not problems:
            left = deadline - time.monotonic()
            if left <= 0:
                problems.append(
                    f"device(s) {sorted(w.device for w in waiting.values())} did not start "
                    f"within {self.timeout + 60:g}s")
                break
            sentinels = {w.process.sentinel: w for w in waiting.values()}
            for ready in wait([*waiting, *sentinels], timeout=min(left, 1.0)):
                w = waiting[ready] if ready in waiting else sentinels[ready]  # type: ignore
                if w.results not in waiting:
                    continue
                try:
                    msg = w.results.recv()
                except (EOFError, OSError):
                    w.process.join(1.0)
                    w.dead = f"worker process {w.pid} {w.process.describe()}"
                    problems.append(f"device {w.device}: {w.dead} during start-up")
                    continue
                if msg[0] == "ready":
                    w.pid = msg[1]["pid"]
                    del waiting[w.results]
                else:
                    problems.append(f"device {w.device}: {msg[1]}\n{msg[2]}")
        if problems:
            raise ExecutionError(
                f"starting {len(self._workers)} {self.backend.value} worker processes failed: "
                + "; ".join(problems))
        for w in self._workers.values():
            w.writer.start()
        self._monitor = threading.Thread(target=self._watch, name="reshard-monitor",
                                         daemon=True)
        self._monitor.start()

    # ----- the monitor ---------------------------------------------------------------
    def _watch(self) -> None:
        conns = {w.results: w for w in self._workers.values()}
        sentinels = {w.process.sentinel: w for w in self._workers.values()}
        # one selector for the group's life (multiprocessing's wait() builds one and
        # registers every pipe and sentinel on each call: with 16 workers, 33 objects
        # for every result an execute returns)
        with selectors.DefaultSelector() as sel:
            sel.register(self._wake_r, selectors.EVENT_READ)
            for obj in (*conns, *sentinels):
                sel.register(obj, selectors.EVENT_READ)
            while conns or sentinels:
                ready = [key.fileobj for key, _ in sel.select()]
                if self._wake_r in ready:
                    return
                for obj in ready:
                    if obj in conns:
                        w = conns[obj]
                        try:
                            call_id, ok, payload = obj.recv()
                        except (EOFError, OSError):
                            del conns[obj]
                            sel.unregister(obj)
                            self._died(w)
                            continue
                        fut = w.pending.pop(call_id, None)
                        if fut is not None and not fut.done():
                            if ok:
                                fut.set_result(payload)
                            else:
                                fut.set_exception(payload)
                    elif obj in sentinels:
                        w = sentinels.pop(obj)
                        sel.unregister(obj)
                        if w.results in conns:  # results still buffered: read them first
                            continue
                        self._died(w)

    def _died(self, w: _Worker) -> None:
        if self._closed:
            return
        w.process.join(1.0)
        reason = f"worker process {w.pid} {w.process.describe()}"
        with self._lock:
            if w.dead is None:
                w.dead = reason
            pending, w.pending = w.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ExecutionError(f"device {w.device}: {w.dead}"))

    # ----- WorkerGroup ---------------------------------------------------------------
    @property
    def devices(self) -> tuple[int, ...]:
        """Devices with a worker."""
        return tuple(sorted(self._workers))

    @property
    def pids(self) -> dict[int, int]:
        """Process id of every device's worker."""
        return {d: w.pid for d, w in self._workers.items() if w.pid is not None}

    def submit(self, device: int, call: WorkerCall) -> Future:
        """Run ``call`` in ``device``'s process (pickled down its pipe)."""
        fut: Future = Future()
        w = self._workers.get(device)
        call_id = next(self._ids)
        try:  # here, not under the group's lock
            data = bytes(ForkingPickler.dumps((call_id, call)))
        except Exception as e:  # noqa: BLE001 - fails the call's future
            fut.set_exception(ExecutionError(
                f"device {device}: cannot send {call_name(call)!r} to the worker: "
                f"{type(e).__name__}: {e}"))
            return fut
        with self._lock:
            if w is None:
                fut.set_exception(ExecutionError(
                    f"device {device} has no worker (workers: {list(self.devices)})"))
            elif self._closed:
                fut.set_exception(ExecutionError("the worker group is closed"))
            elif w.dead is not None:
                fut.set_exception(ExecutionError(f"device {device}: {w.dead}"))
            else:
                w.pending[call_id] = fut
                w.post(call_id, repr(call_name(call)), data)
        return fut

    def ensure(self, devices: Iterable[int]) -> None:
        """Raise naming the devices that have no worker (workers start with the group)."""
        require_workers(devices, self.devices)

    def dead(self) -> dict[int, str]:
        """Devices whose process exited (before :meth:`close`), with why."""
        if self._closed:
            return {}
        out = {}
        for d, w in self._workers.items():
            if w.dead is not None:
                out[d] = w.dead
            elif not w.process.is_alive():
                out[d] = f"worker process {w.pid} {w.process.describe()}"
        return out

    def abort(self) -> None:
        """Kill every worker process now (idempotent)."""
        self.close(grace=0.0)

    def close(self, grace: float | None = None) -> None:
        """Stop every worker process (idempotent): ask, give them ``grace`` seconds
        (None: :data:`_GRACE`), then terminate (for a moment), then kill: bounded by
        ``grace`` and about a second more, whatever state a worker is in (a stopped
        process ignores the terminate)."""
        grace = _GRACE if grace is None else max(0.0, grace)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = [f for w in self._workers.values() for f in w.pending.values()]
            for w in self._workers.values():
                w.pending = {}
        atexit.unregister(self._atexit)
        close = bytes(ForkingPickler.dumps(CLOSE))
        for w in self._workers.values():
            w.post(None, "close", close)
            w.stop_writer()
        deadline = time.monotonic() + grace
        for w in self._workers.values():
            w.process.join(max(0.0, deadline - time.monotonic()))
        for stop, patience in ((("terminate", 0.3), ("kill", 1.0)) if grace else
                               (("kill", 1.0),)):
            alive = [w for w in self._workers.values() if w.process.is_alive()]
            for w in alive:
                getattr(w.process, stop)()
            until = time.monotonic() + patience  # one wait for them all, not one each
            for w in alive:
                w.process.join(max(0.0, until - time.monotonic()))
        with contextlib.suppress(OSError):
            self._wake_w.send(None)
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(2.0)
        for w in self._workers.values():
            for conn in (w.commands, w.results):
                conn.close()
            if not w.process.is_alive():
                w.process.close()
        if self.spawner is not None:
            self.spawner.close()
        self._wake_r.close()
        self._wake_w.close()
        self.rendezvous.close()
        for fut in pending:
            if not fut.done():
                fut.set_exception(ExecutionError("the worker group was closed"))


__all__ = ["NETNS_DIR", "NetnsHost", "NetnsPlacement", "ProcessGroup", "as_placement",
           "enter_netns"]

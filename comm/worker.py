"""The worker loop: one device's part of a plan, step by step in the plan's global order.

A :class:`DeviceWorker` owns the shards held by one device and a :class:`Backend`
rank. The driver loads a plan once (receive/pack scratch buffers are allocated then,
per plan, not per call), then executes it any number of times on named arrays.

Execution follows the plan's steps (tasks with the same ``step``, contiguous in plan
order). A device may take part in several tasks of one step, and no task reads what
another task of its step writes, so a device runs each of its steps in three phases:

1. prepare: copies (``COPY``) are done at once; every other task gets its buffers:
   send data packed from the shard (zero-copy when contiguous), a receive target
   (the destination shard itself when contiguous), each task in its own region of
   the plan's scratch buffer of its dtype (sized when the plan is loaded, for the
   step that needs most); a ``REDUCE`` root first takes a private
   copy of its source shard (once per tensor), so the caller's data stays untouched;
2. issue: every task's operation in plan order between ``group_start`` and
   ``group_end`` (one NCCL group; gloo's asynchronous operations), tagged with the
   task's index in the plan, so they may all be in flight at once; ``group_end``
   returns once they completed (a host-memory backend) or are ordered before later
   work (a stream backend);
3. unpack: received data into the destination shard, reduced sums into the root's
   source copy, all-gathered rows into the destination shard, in plan order.

The device starts its next step only after this one. Each phase dispatches on the
task kind through a table of handlers (:data:`_PREPARE`, :data:`_ISSUE`,
:data:`_UNPACK`). Errors name the task (its index and text), or, when ``group_end``
fails, the step and this device's tasks in it. Plans whose steps have one task per
device run exactly as one blocking operation per task.

A worker whose communicating call (loading, executing, an extension's) fails stops
communicating for good: every later such call fails at once. Calls issued after the
failed one may already wait in its queue; running them would send their messages to
peers still inside the failed plan, which would take them for that plan's (silently
wrong data, or gloo's size-mismatch abort). Its runtime is shut down anyway.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar, cast

import numpy as np

from reshard.comm.backend import Backend
from reshard.comm.packing import pack, recv_target, region, unpack
from reshard.errors import ExecutionError, ReshardError
from reshard.layout import Box, box_size
from reshard.planner.ir import Buffer, ReshardPlan, Task, TaskKind

F = TypeVar("F", bound=Callable[..., Any])


def _communicating(method: F) -> F:
    """A worker call that talks to peers: refused once one has failed here, and its
    own failure refuses every later one (see the module docstring)."""

    @functools.wraps(method)
    def run(self: DeviceWorker, *args: Any, **kwargs: Any) -> Any:
        if self.failed is not None:
            raise ExecutionError(
                f"device {self.device}: not running {method.__name__}: a call failed here "
                f"earlier ({self.failed}); the runtime must be restarted")
        try:
            return method(self, *args, **kwargs)
        except BaseException as e:
            self.failed = f"{type(e).__name__}: {e}"[:400]
            raise

    return cast(F, run)


@dataclass(frozen=True)
class StepTask:
    """A task of one device in a loaded plan.

    Attributes:
        index: its position in the plan's tasks (its tag on the wire).
        task: the task.
        offset: where its region starts in the scratch buffer of its tensor's dtype
            (the tasks of one step use disjoint regions).
    """

    index: int
    task: Task
    offset: int

    def __str__(self) -> str:
        return f"task #{self.index} ({self.task})"


@dataclass
class LoadedPlan:
    """A plan prepared for one device."""

    plan: ReshardPlan
    steps: tuple[tuple[StepTask, ...], ...]  # this device's tasks by step, in plan order
    src_box: dict[int, Box]  # tensor -> this device's source box
    dst_box: dict[int, Box]  # tensor -> this device's destination box
    scratch: dict[str, Any]  # dtype name -> 1-d scratch buffer
    backend: Backend  # the (channel's) backend the plan runs on

    @property
    def num_tasks(self) -> int:
        """Tasks this device takes part in."""
        return sum(len(step) for step in self.steps)


def _scratch_elems(task: Task, device: int) -> int:
    """Scratch elements ``task`` needs on ``device`` (a packed or received box, a
    reduce addend, an all-gather's input and rows)."""
    n = box_size(task.box)
    if task.kind is TaskKind.ALLGATHER:
        m = max((box_size(p) for p in task.pieces), default=0)
        return m * (len(task.receivers) + 1)
    if task.kind is TaskKind.COPY:
        return 0
    return n


def _steps(plan: ReshardPlan, device: int) -> tuple[tuple[tuple[StepTask, ...], ...],
                                                        dict[str, int]]:
    """``device``'s tasks grouped by step (runs of equal ``step`` in plan order), each
    with its scratch offset; and per dtype the scratch elements the fullest step needs
    (the sum of its tasks' needs)."""
    mine = ((i, t) for i, t in enumerate(plan.tasks) if device in t.devices)
    steps: list[tuple[StepTask, ...]] = []
    need: dict[str, int] = {}
    for _, run in itertools.groupby(mine, key=lambda it: it[1].step):
        used: dict[str, int] = {}
        step = []
        for i, t in run:
            dt = plan.tensors[t.tensor].dtype
            step.append(StepTask(i, t, used.get(dt, 0)))
            used[dt] = used.get(dt, 0) + _scratch_elems(t, device)
        for dt, n in used.items():
            need[dt] = max(need.get(dt, 0), n)
        steps.append(tuple(step))
    return tuple(steps), need


@dataclass
class _Op:
    """A task of the running step on this device, with its buffers.

    Attributes:
        st: the task.
        buf: SEND / BROADCAST: the packed data (root) or the receive target; REDUCE:
            this device's addend (the sum, at the root); ALLGATHER: this device's piece.
        rows: ALLGATHER: the gathered rows, one per member.
        sent: bytes this device sends.
    """

    st: StepTask
    buf: Any
    rows: Any = None
    sent: int = 0

    @property
    def task(self) -> Task:
        """The task."""
        return self.st.task


class _Execution:
    """One execution of a loaded plan on one device: its shards, and the handlers of
    each phase per task kind (the tables below the class)."""

    def __init__(self, device: int, lp: LoadedPlan, src: dict[int, Any],
                 dst: dict[int, Any]) -> None:
        self.device, self.lp, self.src, self.dst = device, lp, src, dst
        self.backend = lp.backend
        self._private: set[int] = set()  # tensors whose source shard is a private copy

    def own_sources(self, step: Sequence[StepTask]) -> None:
        """Before a step: a REDUCE root sums into a private copy of its source shard
        (one per tensor), never into the caller's array."""
        for st in step:
            t = st.task
            if t.kind is TaskKind.REDUCE and t.root == self.device and \
                    t.tensor not in self._private:
                self.src[t.tensor] = self.src[t.tensor].copy()
                self._private.add(t.tensor)

    def _scratch(self, st: StepTask, n: int) -> Any:
        """The task's own ``n``-element region of the scratch buffer."""
        buf = self.lp.scratch[self.lp.plan.tensors[st.task.tensor].dtype]
        return buf[st.offset:st.offset + n]

    # ----- prepare: copies done, buffers ready (None: nothing to issue) -----------------
    def prepare_copy(self, st: StepTask) -> _Op | None:
        """COPY: done here; nothing to issue."""
        t, lp = st.task, self.lp
        i = t.tensor
        region(self.dst[i], t.box, lp.dst_box[i])[...] = region(self.src[i], t.box, lp.src_box[i])
        return None

    def prepare_transfer(self, st: StepTask) -> _Op | None:
        """SEND and BROADCAST: the root packs its box; a receiver picks its target."""
        t, lp = st.task, self.lp
        i, n = t.tensor, box_size(t.box)
        if t.root == self.device:
            if t.source is Buffer.SRC:
                shard, shard_box = self.src[i], lp.src_box[i]
            else:  # a relay of what this device received in an earlier step
                shard, shard_box = self.dst[i], lp.dst_box[i]
            buf = pack(shard, t.box, shard_box, self._scratch(st, n))
            return _Op(st, buf, sent=n * buf.itemsize)
        if self.device in t.through:  # a relay: scratch in, passed on, kept nowhere
            return _Op(st, self._scratch(st, n))
        return _Op(st, recv_target(self.dst[i], t.box, lp.dst_box[i], self._scratch(st, n)))

    def prepare_reduce(self, st: StepTask) -> _Op | None:
        """Every member's addend into its scratch region (reduced in place)."""
        t = st.task
        n = box_size(t.box)
        buf = self._scratch(st, n)
        buf.reshape(tuple(hi - lo for lo, hi in t.box))[...] = region(
            self.src[t.tensor], t.box, self.lp.src_box[t.tensor])
        return _Op(st, buf, sent=0 if t.root == self.device else n * buf.itemsize)

    def prepare_gather(self, st: StepTask) -> _Op | None:
        """This device's piece into its input row; the rows behind it."""
        t = st.task
        k, m = len(t.group), max(box_size(p) for p in t.pieces)
        scratch = self._scratch(st, m * (k + 1))
        inp, rows = scratch[:m], scratch[m:].reshape(k, m)
        mine = dict(zip(t.receivers, t.pieces))[self.device]
        pn = box_size(mine)
        if pn:
            inp[:pn] = region(self.dst[t.tensor], mine, self.lp.dst_box[t.tensor]).reshape(-1)
        return _Op(st, inp, rows, sent=pn * inp.itemsize * (k - 1))

    # ----- issue: inside the step's group, tagged with the task's index ----------------
    def issue_send(self, op: _Op) -> None:
        """SEND: the root sends, the receiver receives."""
        t = op.task
        if t.root == self.device:
            self.backend.send(op.buf, t.receivers[0], tag=op.st.index)
        else:
            self.backend.recv(op.buf, t.root, tag=op.st.index)

    def issue_broadcast(self, op: _Op) -> None:
        """BROADCAST: the receivers in chain order (for backends that pipeline one)."""
        t = op.task
        self.backend.broadcast(op.buf, t.root, t.group, chain=t.receivers, tag=op.st.index)

    def issue_reduce(self, op: _Op) -> None:
        """REDUCE: summed into the root's buffer."""
        self.backend.reduce(op.buf, op.task.root, op.task.group)

    def issue_gather(self, op: _Op) -> None:
        """ALLGATHER: every member's piece into every member's rows."""
        self.backend.all_gather(op.rows, op.buf, op.task.group)

    # ----- unpack: after the group completed ----------------------------------------
    def unpack_received(self, op: _Op) -> None:
        """SEND and BROADCAST: a receiver's box into its destination shard."""
        t = op.task
        if t.root != self.device and self.device not in t.through:
            unpack(self.dst[t.tensor], t.box, self.lp.dst_box[t.tensor], op.buf)

    def unpack_reduced(self, op: _Op) -> None:
        """The root's sum into its (private) source shard."""
        t = op.task
        if t.root == self.device:
            unpack(self.src[t.tensor], t.box, self.lp.src_box[t.tensor], op.buf)

    def unpack_gathered(self, op: _Op) -> None:
        """The other members' pieces into the destination shard."""
        t = op.task
        piece_of = dict(zip(t.receivers, t.pieces))
        for row, member in enumerate(t.group):
            piece = piece_of[member]
            if member != self.device and box_size(piece):
                unpack(self.dst[t.tensor], piece, self.lp.dst_box[t.tensor], op.rows[row])


_PREPARE: Mapping[TaskKind, Callable[[_Execution, StepTask], _Op | None]] = MappingProxyType({
    TaskKind.COPY: _Execution.prepare_copy,
    TaskKind.SEND: _Execution.prepare_transfer,
    TaskKind.BROADCAST: _Execution.prepare_transfer,
    TaskKind.REDUCE: _Execution.prepare_reduce,
    TaskKind.ALLGATHER: _Execution.prepare_gather,
})
"""Phase 1 per task kind: do a copy, or make the task's buffers ready."""

_ISSUE: Mapping[TaskKind, Callable[[_Execution, _Op], None]] = MappingProxyType({
    TaskKind.SEND: _Execution.issue_send,
    TaskKind.BROADCAST: _Execution.issue_broadcast,
    TaskKind.REDUCE: _Execution.issue_reduce,
    TaskKind.ALLGATHER: _Execution.issue_gather,
})
"""Phase 2 per task kind: start the task's operation inside the step's group."""

_UNPACK: Mapping[TaskKind, Callable[[_Execution, _Op], None]] = MappingProxyType({
    TaskKind.SEND: _Execution.unpack_received,
    TaskKind.BROADCAST: _Execution.unpack_received,
    TaskKind.REDUCE: _Execution.unpack_reduced,
    TaskKind.ALLGATHER: _Execution.unpack_gathered,
})
"""Phase 3 per task kind: received data into place once the group completed."""


class DeviceWorker:
    """Executes plans for one device.

    Args:
        device: the global device id served.
        backend: this device's backend rank.
    """

    def __init__(self, device: int, backend: Backend) -> None:
        self.device = device
        self.backend = backend
        self.arrays: dict[str, Any] = {}
        self.plans: dict[int, LoadedPlan] = {}
        self.current: tuple[int, str] | None = None  # (task index, task text) in flight
        self.channels: dict[str, Backend] = {}
        self.extensions: dict[str, Any] = {}
        self.failed: str | None = None  # why a communicating call failed here

    # ----- channels and extensions -----------------------------------------------------
    def backend_for(self, channel: str | None) -> Backend:
        """The backend of a communication channel: plans loaded on different channels
        use separate communicators, so they can run concurrently from different
        threads (the pipeline runtime's transfer threads)."""
        if channel is None:
            return self.backend
        b = self.channels.get(channel)
        if b is None:
            b = self.channels[channel] = self.backend.channel(channel)
        return b

    @_communicating
    def attach(self, name: str, factory: str, *args: Any) -> None:
        """Build ``factory(self, *args)`` (``"package.module:callable"``) in this worker
        and keep it under ``name``: the way layers above comm (the pipeline runtime)
        run their own code next to the worker's arrays and plans."""
        import importlib

        path, _, attr = factory.partition(":")
        self.extensions[name] = getattr(importlib.import_module(path), attr)(self, *args)

    @_communicating
    def invoke(self, name: str, method: str, *args: Any) -> Any:
        """Call ``method`` of the extension ``name``."""
        ext = self.extensions.get(name)
        if ext is None:
            raise ReshardError(f"device {self.device}: no extension {name!r} attached")
        return getattr(ext, method)(*args)

    # ----- data ----------------------------------------------------------------------
    def put(self, key: str, shard: np.ndarray) -> None:
        """Store a shard under ``key`` on this device."""
        self.arrays[key] = self.backend.asarray(np.ascontiguousarray(shard))

    def get(self, key: str) -> np.ndarray:
        """The shard stored under ``key``, as numpy."""
        try:
            return self.backend.to_host(self.arrays[key])
        except KeyError:
            raise ReshardError(f"device {self.device} holds no array {key!r}") from None

    def drop(self, keys: Sequence[str]) -> None:
        """Forget arrays."""
        for k in keys:
            self.arrays.pop(k, None)

    def ping(self) -> int:
        """Liveness check: returns the device id."""
        return self.device

    def stats(self) -> dict[str, int]:
        """What this worker holds: arrays, loaded plans, their scratch bytes, channels."""
        scratch = sum(int(b.nbytes) for lp in self.plans.values() for b in lp.scratch.values())
        return {"arrays": len(self.arrays), "plans": len(self.plans),
                "scratch_bytes": scratch, "channels": len(self.channels)}

    # ----- plans ---------------------------------------------------------------------
    @_communicating
    def load_plan(self, plan_id: int, plan: ReshardPlan | str,
                  channel: str | None = None, verified: bool = False) -> int:
        """Prepare ``plan`` (object or JSON) under ``plan_id`` on ``channel`` (default:
        the main one): the backend creates the communicators it lacks, then scratch
        buffers are allocated. Returns the number of tasks this device takes part in.

        Args:
            plan_id: the id the driver will execute it by.
            plan: the plan, or its JSON.
            channel: the communication channel.
            verified: JSON text from a driver that verified the plan (not again here).
        """
        if isinstance(plan, str):
            plan = ReshardPlan.from_json(plan, verify=not verified)
        backend = self.backend_for(channel)
        try:
            backend.prepare(plan)
        except ReshardError:
            raise
        except Exception as e:
            raise ExecutionError(
                f"device {self.device}: setting up communicators for plan {plan_id} failed: "
                f"{type(e).__name__}: {e}") from e
        d = self.device
        src_box, dst_box = {}, {}
        for i, t in enumerate(plan.tensors):
            if d in t.src.devices:
                src_box[i] = t.src.boxes(t.shape)[d]
            if d in t.dst.devices:
                dst_box[i] = t.dst.boxes(t.shape)[d]
        steps, need = _steps(plan, d)
        scratch = {dt: backend.empty(n, np.dtype(dt)) for dt, n in need.items()}
        lp = self.plans[plan_id] = LoadedPlan(plan, steps, src_box, dst_box, scratch, backend)
        return lp.num_tasks

    def unload_plan(self, plan_id: int) -> None:
        """Free a plan's scratch buffers."""
        self.plans.pop(plan_id, None)

    @_communicating
    def execute(self, plan_id: int, in_keys: Sequence[str | None],
                out_keys: Sequence[str]) -> int:
        """Run this device's tasks of a loaded plan.

        Args:
            plan_id: a plan loaded with :meth:`load_plan`.
            in_keys: per tensor, the key of this device's source shard.
            out_keys: per tensor, the key to store this device's destination shard under.

        Returns:
            Bytes this device sent.
        """
        lp = self.plans.get(plan_id)
        if lp is None:
            raise ReshardError(f"device {self.device}: plan {plan_id} is not loaded")
        plan = lp.plan
        backend = lp.backend
        backend.activate()  # e.g. make the GPU current in this thread
        xp = backend.xp
        src: dict[int, Any] = {}
        for i in lp.src_box:
            key = in_keys[i]
            if key is None or key not in self.arrays:
                raise ReshardError(
                    f"device {self.device} holds no source shard {key!r} for tensor {i}")
            src[i] = self.arrays[key]
        dst: dict[int, Any] = {}
        for i, box in lp.dst_box.items():
            t = plan.tensors[i]
            dst[i] = xp.zeros(tuple(b - a for a, b in box), dtype=np.dtype(t.dtype))
        run = _Execution(self.device, lp, src, dst)
        sent = sum(self._run_step(run, step) for step in lp.steps)
        backend.synchronize()
        self.current = None
        for i, arr in dst.items():
            self.arrays[out_keys[i]] = arr
        return sent

    # ----- one step --------------------------------------------------------------------
    def _run_step(self, run: _Execution, step: tuple[StepTask, ...]) -> int:
        """This device's tasks of one step: prepared, issued as one group, unpacked
        (the module docstring's three phases). Returns the bytes sent."""
        run.own_sources(step)
        ops = []
        for st in step:
            with self._blame(st):
                op = _PREPARE[st.task.kind](run, st)
            if op is not None:
                ops.append(op)
        if not ops:
            return 0
        backend = run.backend
        backend.group_start()
        for op in ops:
            with self._blame(op.st):
                _ISSUE[op.task.kind](run, op)
        with self._blame(*(op.st for op in ops), step=True):
            backend.group_end()
        for op in ops:
            with self._blame(op.st):
                _UNPACK[op.task.kind](run, op)
        return sum(op.sent for op in ops)

    @contextlib.contextmanager
    def _blame(self, *tasks: StepTask, step: bool = False) -> Iterator[None]:
        """Run the body as work on ``tasks``; its errors become ExecutionErrors naming
        the task, or (``step``) the step and its tasks on this device."""
        self.current = (tasks[0].index, str(tasks[0].task))
        what = ", ".join(str(st) for st in tasks[:8])
        if len(tasks) > 8:
            what += f", +{len(tasks) - 8} more"
        if step:
            what = f"step {tasks[0].task.step} ({what})"
        try:
            yield
        except ReshardError as e:
            raise ExecutionError(f"device {self.device}: {what} failed: {e}") from e
        except Exception as e:  # backend errors of any type
            raise ExecutionError(
                f"device {self.device}: {what} failed: {type(e).__name__}: {e}") from e


__all__ = ["DeviceWorker", "LoadedPlan", "StepTask"]

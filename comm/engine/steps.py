"""A loaded program's steps: what one device runs, laid out before it runs.

A plan's tasks with the same ``step`` are contiguous in plan order; a device takes part
in some tasks of some steps. :func:`program_steps` lays a device's program out as its
steps (fusing a fused sum's parts where the backend cannot, coalescing a step's tasks
between the same devices into messages, :mod:`reshard.planner.schedule.coalesce`);
:class:`LoadedProgram` is that layout prepared on a backend rank (communicators made,
one scratch buffer sized for the step that needs most), with each coalesced message's
layout (:class:`MessageLayout`: its payloads back to back in one scratch region, made
on the first run). :mod:`reshard.comm.engine.execution` runs it, step by step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reshard.comm.backend import Backend, Capabilities
from reshard.comm.engine.packing import (
    byte_span,
    local_slices,
    row_runs,
)
from reshard.comm.program import Destination, WorkerProgram
from reshard.core.dtypes import itemsize, parse_dtype
from reshard.core.layout import Box, box_size
from reshard.planner.schedule import coalesce as coalescing
from reshard.planner.schedule.staging import ALIGN, buffer_dtype, region_bytes, scratch_elems
from reshard.planner.values.tasks import Buffer, Task, TaskKind, allreduce_parts, delivers


@dataclass(frozen=True)
class StepTask:
    """A task of one device in a loaded program.

    Attributes:
        index: its position in the plan's tasks (its tag on the wire).
        task: the task.
        offset: the byte where its region starts in the program's scratch buffer (the
            tasks of one step use disjoint regions).
        message: the first task (in plan order) of a coalesced message
            (:mod:`reshard.planner.schedule.coalesce`): the message's bytes, its tasks' regions
            back to back from ``message_at``; else 0.
        follows: a later task of a coalesced message (the first one issues it).
        message_at: where the message of a ``message`` task starts (scratch bytes).
        members: of a ``message`` task, the positions in its step of the tasks that
            follow it (made ready before it issues the message).
    """

    index: int
    task: Task
    offset: int
    message: int = 0
    follows: bool = False
    message_at: int = 0
    members: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"task #{self.index} ({self.task})"


def program_steps(program: WorkerProgram, fuses: bool = True, coalesce: bool = True,
                  all_reduces: bool = True
                  ) -> tuple[tuple[tuple[StepTask, ...], ...], int]:
    """The program's tasks grouped by step (runs of equal ``step`` in plan order), each
    with its byte offset in the scratch buffer; and the scratch bytes the fullest step
    needs (the sum of its tasks' regions, each aligned to :data:`ALIGN` bytes: one
    buffer serves every dtype, :mod:`reshard.planner.schedule.staging`).

    ``fuses``: the backend sums a broadcast's addends on the way
    (``Capabilities.fuses_sums``). Else each such broadcast runs as its
    :meth:`~reshard.planner.ir.Task.parts`: the reduction in its step, the broadcast of
    the sum in a second half of the step after every task of the first (on every
    device alike, so the plan's one global order still holds).

    ``all_reduces``: the backend has an all-reduce (``Capabilities.all_reduces``). Else
    each ``ALLREDUCE`` runs as its :func:`~reshard.planner.values.tasks.allreduce_parts`, the
    reduction in its step and the broadcast of the sum in the step's second half.

    ``coalesce``: small transfers of a step that share their route travel as one message
    (:mod:`reshard.planner.schedule.coalesce`); every device of a plan must agree on it.
    """
    device = program.device
    runs: list[tuple[tuple[int, int], int, Task]] = []
    for i, t in program.tasks:
        split = t.parts() if t.addends and not fuses else allreduce_parts(t) \
            if t.kind is TaskKind.ALLREDUCE and not all_reduces else None
        if split is not None:
            for half, part in enumerate(split):
                if device in part.devices:
                    runs.append(((t.step, half), i, part))
        else:
            runs.append(((t.step, 0), i, t))
    runs.sort(key=lambda r: r[0])  # stable: plan order inside each (half) step
    steps: list[tuple[StepTask, ...]] = []
    need = 0
    for _, group in itertools.groupby(runs, key=lambda r: r[0]):
        run = [(i, t) for _, i, t in group]
        placed, used = _place(run, program, coalesce)
        need = max(need, used)
        steps.append(tuple(placed[i] for i, _ in run))
    return tuple(steps), need


def _place(run: list[tuple[int, Task]], program: WorkerProgram, coalesce: bool
           ) -> tuple[dict[int, StepTask], int]:
    """One step's tasks at their offsets in the scratch buffer, and the bytes used: a
    coalesced message's payloads back to back, widest dtype first (each then starts
    aligned to its itemsize, and no padding crosses the wire), its first task in plan
    order issuing it; then every other task's region, aligned."""
    tensors = program.tensors
    size = {i: scratch_elems(t, program.device) * itemsize(buffer_dtype(tensors[t.tensor], t))
            for i, t in run}
    placed: dict[int, StepTask] = {}
    used = 0
    # a task with addends never travels with others: the rest stage one region
    found = coalescing.messages(run, lambda r: r[1], lambda t: tensors[t.tensor],
                                _staged(size)) if coalesce else []
    pos = {j: k for k, (j, _) in enumerate(run)} if found else {}
    for msg in found:
        wide = sorted(msg, key=lambda r: -itemsize(buffer_dtype(tensors[r[1].tensor], r[1])))
        start, total = used, sum(size[i] for i, _ in msg)
        for i, t in wide:
            placed[i] = StepTask(i, t, used, 0, True)
            used += size[i]
        i, t = msg[0]
        placed[i] = StepTask(i, t, placed[i].offset, total, False, start,
                             tuple(pos[j] for j, _ in msg[1:]))
        used = start + region_bytes(total)
    for i, t in run:
        if i not in placed:
            placed[i] = StepTask(i, t, used)
            used += region_bytes(size[i])
    return placed, used


def _staged(size: dict[int, int]) -> Callable[[tuple[int, Task]], int]:
    """A ``(index, task)``'s staging bytes: its region, aligned (``size``: unaligned)."""
    return lambda r: region_bytes(size[r[0]])


@dataclass
class LoadedProgram:
    """A program prepared on one device: communicators made, scratch allocated.

    Attributes:
        program: the program.
        steps: its tasks by step, in plan order.
        src_box: tensor -> this device's source box.
        dst_box: tensor -> this device's destination box.
        scratch: the 1-d byte buffer every task's scratch region lies in.
        backend: the (channel's) backend rank it runs on.
        capabilities: what its runs may ask of the backend (the executor's: the rank's
            own, or less; None: the rank's own).
    """

    program: WorkerProgram
    steps: tuple[tuple[StepTask, ...], ...]
    src_box: dict[int, Box]
    dst_box: dict[int, Box]
    scratch: Any
    backend: Backend
    capabilities: Capabilities | None = None
    _elements: dict[str, Any] = field(default_factory=dict, repr=False)
    _regions: dict[tuple[int, int, str], Any] = field(default_factory=dict, repr=False)
    _messages: dict[int, MessageLayout] = field(default_factory=dict, repr=False)
    _owners: dict[int, tuple[StepTask, ...]] = field(default_factory=dict, repr=False)

    @property
    def num_tasks(self) -> int:
        """Tasks this device takes part in."""
        return sum(len(step) for step in self.steps)

    @property
    def device(self) -> int:
        """The device it runs on."""
        return self.program.device

    def destinations(self) -> tuple[Destination, ...]:
        """The buffers this device receives into, by request: the shapes and dtypes
        of :meth:`Executor.run`'s ``out`` (:meth:`WorkerProgram.destinations`)."""
        return self.program.destinations()

    def dst_shape(self, tensor: int) -> tuple[int, ...]:
        """Shape of this device's destination shard of ``tensor``."""
        return tuple(b - a for a, b in self.dst_box[tensor])

    def src_shape(self, tensor: int) -> tuple[int, ...]:
        """Shape of this device's source shard of ``tensor``."""
        return tuple(b - a for a, b in self.src_box[tensor])

    def region(self, offset: int, n: int, dtype: str) -> Any:
        """``n`` elements of ``dtype`` (a name) at byte ``offset`` of the scratch buffer,
        as the backend holds that dtype (its own element type: cupy keeps bfloat16 as
        its bits), sharing the buffer's memory. Made once per region: the scratch buffer
        lives as long as the loaded program, and a step's tasks ask for theirs on every
        run."""
        key = (offset, n, dtype)
        view = self._regions.get(key)
        if view is None:
            elem = self._elements.get(dtype)
            if elem is None:  # what the backend's buffers of that dtype hold
                elem = self._elements[dtype] = self.backend.empty(0, parse_dtype(dtype)).dtype
            view = self._regions[key] = self.scratch[offset:offset + n * itemsize(dtype)].view(elem)
        return view

    def owners(self, step: Sequence[StepTask]) -> tuple[StepTask, ...]:
        """The tasks of ``step`` (one of :attr:`steps`) that sum into this device's
        source shard: a REDUCE or a broadcast with addends whose root it is, an
        ALLREDUCE whose sum it keeps there (found on the step's first run)."""
        key = id(step)  # the steps live as long as the program
        got = self._owners.get(key)
        if got is None:
            me = self.device
            got = self._owners[key] = tuple(
                st for st in step if ((st.task.kind is TaskKind.REDUCE or st.task.addends)
                and st.task.root == me) or (st.task.kind is TaskKind.ALLREDUCE
                and not self.delivers(st.task)))
        return got

    def delivers(self, t: Task) -> bool:
        """An ALLREDUCE's sum lands in this device's destination shard (which holds
        its box), not in its source copy."""
        return delivers(self.dst_box.get(t.tensor), t.box)

    def message(self, st: StepTask, step: Sequence[StepTask]) -> MessageLayout:
        """The layout of the coalesced message ``st`` issues (``step``: its step) on this
        device (:class:`MessageLayout`), made on its first run."""
        got = self._messages.get(st.index)
        if got is None:
            tensors, me = self.program.tensors, self.device
            pieces = []
            for m in (st, *(step[k] for k in st.members)):
                t = m.task
                i, dtype = t.tensor, buffer_dtype(tensors[t.tensor], t)
                flat = self.region(m.offset, box_size(t.box), dtype)
                # a root's source shard, or a destination shard (a relay may hold neither)
                reads = t.root == me and t.source is Buffer.SRC
                box = (self.src_box if reads else self.dst_box).get(i)
                start = m.offset - st.message_at
                runs = None if box is None else row_runs(t.box, box, itemsize(dtype))
                rows = packed_rows = None
                if runs is not None and isinstance(flat, np.ndarray):  # host memory
                    shape, run, offset, strides = runs
                    void = np.dtype((np.void, run))
                    rows = (shape, void, offset, strides)
                    packed_rows = flat.view(np.uint8).view(void).reshape(shape)
                pieces.append(MessagePiece(
                    m, i, () if box is None else local_slices(t.box, box), flat,
                    flat.reshape(tuple(hi - lo for lo, hi in t.box)), start,
                    start + box_size(t.box) * itemsize(dtype),
                    None if box is None else byte_span(t.box, box, itemsize(dtype)),
                    reads, rows, packed_rows))
            pieces.sort(key=lambda p: p.start)
            got = self._messages[st.index] = MessageLayout(
                tuple(pieces), self.region(st.message_at, st.message, "uint8"))
        return got


@dataclass(frozen=True)
class MessagePiece:
    """A coalesced task's payload in its message on one device, kept with the program
    (a coalesced step runs many small tasks: slicing and reshaping once per load, not
    per run, is most of what it costs per task).

    Attributes:
        st: the task.
        tensor: its tensor.
        slices: where its box lies in this device's shard: its source shard at the
            task's root (a relay's root: its destination shard), its destination shard
            elsewhere; () where it holds neither.
        flat: its region of the message's scratch memory, 1-d, in its buffer dtype.
        shaped: the same memory in the box's shape.
        start: where its bytes start in the message.
        end: where they end.
        span: its bytes in that shard when the shard is C-contiguous and the box one
            run of it (:func:`~reshard.comm.engine.packing.byte_span`); None where strided.
        plain: at its root, it is read from the source shard (not a relay's box of its
            destination shard).
        rows: where span is None, its runs in that shard
            (:func:`~reshard.comm.engine.packing.row_runs`: shape, run bytes, offset,
            strides); None for an empty box or no shard.
        packed_rows: where ``rows`` is set, ``flat`` as those runs (elements of ``run``
            bytes each), which a copy from or to the shard's runs moves one run at a time.
    """

    st: StepTask
    tensor: int
    slices: tuple[slice, ...]
    flat: Any
    shaped: Any
    start: int
    end: int
    span: tuple[int, int] | None
    plain: bool
    rows: tuple[tuple[int, ...], Any, int, tuple[int, ...]] | None = None
    packed_rows: Any = None

    def runs_in(self, whole: Any) -> Any:
        """Its box as runs (``rows``) of a C-contiguous shard whose bytes are ``whole``."""
        shape, void, offset, strides = self.rows  # type: ignore[misc]
        return np.ndarray(shape, void, buffer=whole, offset=offset, strides=strides)


@dataclass(frozen=True)
class MessageLayout:
    """A coalesced message on one device: its payloads in message order and its
    scratch region (the payloads back to back, as 1-d bytes)."""

    pieces: tuple[MessagePiece, ...]
    region: Any


__all__ = ["ALIGN", "LoadedProgram", "MessageLayout", "MessagePiece", "StepTask",
           "buffer_dtype", "program_steps", "scratch_elems"]

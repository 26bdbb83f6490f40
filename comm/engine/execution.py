"""One device's execution of a loaded program: the sources and the step loop.

Execution follows the plan's steps (tasks with the same ``step``, contiguous in plan
order). A device may take part in several tasks of one step, and no task reads what
another task of its step writes, so a device runs each of its steps in three phases,
each dispatched on the task kind through :data:`reshard.comm.engine.kinds.KINDS` (one
small class per kind, with its prepare, issue and unpack):

1. prepare: copies (``COPY``) are done at once; every other task gets its buffers,
   each task in its own region of the program's scratch buffer (one byte buffer for
   every dtype, sized when the program is loaded for the step that needs most); a
   ``REDUCE`` root first takes a private copy of its source shard (once per tensor), so
   the caller's data stays untouched;
2. issue: every task's operation in plan order between ``group_start`` and
   ``group_end`` (one NCCL group; gloo's asynchronous operations), tagged with the
   task's index in the plan, so they may all be in flight at once; ``group_end``
   returns once they completed (a host-memory backend) or are ordered before later
   work (a stream backend);
3. unpack: received data into the destination shard, reduced sums into the root's
   source copy, all-gathered rows into the destination shard, in plan order (a
   backend that reports a broadcast's pieces as they land has had most of a
   scratch-received box copied into place during phase 2 already).

A coalesced message is one operation of its first task
(:mod:`reshard.comm.engine.message`). The device starts its next step only after this
one. Plans whose steps have one task per device run exactly as one blocking operation
per task.

Buffers are whatever the backend's ranks use (numpy, cupy or torch arrays): the engine
only slices, reshapes and assigns them, and allocates through the backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from reshard.comm.engine.box_batch import BoxBatch
from reshard.comm.engine.derived import DERIVE
from reshard.comm.engine.kinds import KINDS
from reshard.comm.engine.message import Messages
from reshard.comm.engine.packing import pack, region
from reshard.comm.engine.step_ops import Op
from reshard.comm.engine.steps import LoadedProgram, StepTask
from reshard.core.bits import assign
from reshard.core.casting import convert_into, quantize_into
from reshard.core.dtypes import ScaleMode, block_shape, parse_dtype
from reshard.core.layout import Box, box_size
from reshard.planner.schedule.staging import buffer_dtype
from reshard.planner.values.tasks import Task

Blame = Callable[..., AbstractContextManager[None]]
"""``blame(*step_tasks, step=False)``: a context that turns errors of its body into
errors naming those tasks (or the step)."""


class Execution:
    """One execution of a loaded program on one device: its shards, and the step loop.

    Sources the plan derives (a scaled cast's amax and scales, see
    :mod:`reshard.planner.values.scales`) are computed when first read, by
    :data:`reshard.comm.engine.derived.DERIVE`.

    Args:
        lp: the loaded program.
        src: tensor -> this device's source shard (read only, except a REDUCE root's
            private copy); derived tensors are computed, not given.
        dst: tensor -> this device's destination shard (written).
    """

    def __init__(self, lp: LoadedProgram, src: dict[int, Any], dst: dict[int, Any]) -> None:
        self.device, self.lp, self.src, self.dst = lp.device, lp, src, dst
        self.backend = lp.backend
        self.caps = lp.capabilities or lp.backend.capabilities
        self.tensors = lp.program.tensors
        self._private: set[int] = set()  # tensors whose source shard is a private copy
        self._converts: dict[int, bool] = {}  # tensor -> converts(tensor), until private
        self.scale_values_of: dict[int, Any] = {}  # scales tensor -> its float32 values here
        self.batch = BoxBatch()  # a step's GPU box copies, one launch before they are read
        self.messages = Messages(self)

    # ----- sources ---------------------------------------------------------------------
    def source(self, i: int) -> Any:
        """This device's source shard of tensor ``i`` (derived on first use)."""
        shard = self.src.get(i)
        if shard is None:
            shard = self.src[i] = DERIVE[self.tensors[i].derive](self, i)
        return shard

    def scale_values(self, k: int) -> Any:
        """Scales tensor ``k``'s source shard here as float32 values (what packing
        divides by; :mod:`reshard.comm.engine.derived`)."""
        self.source(k)
        return self.scale_values_of[k]

    def convert_into(self, out: Any, values: Any, i: int, box: Box) -> None:
        """``out[...] = values`` (``box`` of tensor ``i``) as the wire carries it:
        converted to the destination dtype, divided by its scales if it has them."""
        pt = self.tensors[i]
        if pt.scale is ScaleMode.NONE:
            convert_into(out, values, pt.out_dtype, self.held_dtype(i))
            return
        k = pt.link
        block = block_shape(pt.shape, pt.scale, pt.fold)
        quantize_into(out, values, box, block, self.scale_values(k), self.lp.src_box[k],
                      pt.out_dtype, self.held_dtype(i))

    def held_dtype(self, i: int) -> str:
        """The dtype of tensor ``i``'s source shard here: its own, or its accumulator once
        the shard is a private copy that sums (a backend may hold either as its bits)."""
        pt = self.tensors[i]
        return (pt.sum_dtype or pt.dtype) if i in self._private else pt.dtype

    def converts(self, i: int) -> bool:
        """True if tensor ``i``'s source shard here is not what the wire carries (a cast,
        scales, or a partial sum's accumulator)."""
        got = self._converts.get(i)
        if got is None:
            pt = self.tensors[i]
            got = self._converts[i] = (self.held_dtype(i) != pt.out_dtype
                                       or pt.scale is not ScaleMode.NONE)
        return got

    def own_sources(self, step: Sequence[StepTask]) -> None:
        """Before a step: a REDUCE root (or a broadcast's that sums addends) sums into
        a private copy of its source shard (one per tensor), never into the caller's
        array."""
        for st in self.lp.owners(step):
            i = st.task.tensor
            if i not in self._private:
                shard = self.source(i)
                pt = self.tensors[i]
                acc = pt.sum_dtype or pt.dtype
                copy = self.backend.empty(math.prod(shard.shape), parse_dtype(acc))
                copy = copy.reshape(tuple(shard.shape))
                assign(copy, acc, shard, pt.dtype)  # into the accumulator: exact
                self.src[i] = copy
                self._private.add(i)
                self._converts.pop(i, None)
                self.messages.forget(i)

    # ----- a task's buffers (what the kinds ask for) -------------------------------------
    def pack_source(self, st: StepTask, shard: Any, shard_box: Box, n: int) -> Any:
        """The task's box of a source shard as a 1-d buffer of the wire's dtype: a view
        where it is already contiguous and converts nothing, else a (converted) copy in
        the task's scratch region."""
        t = st.task
        if not self.converts(t.tensor):
            return pack(shard, t.box, shard_box, self.scratch(st, n), self.batch)
        buf = self.scratch(st, n)
        self.convert_into(buf, region(shard, t.box, shard_box), t.tensor, t.box)
        return buf

    def addend(self, st: StepTask) -> Any:
        """A copy of this device's source box of the task in the task's scratch region
        (an addend that a reduction sums into; in its accumulator)."""
        t = st.task
        buf = self.scratch(st, box_size(t.box))
        assign(buf.reshape(tuple(hi - lo for lo, hi in t.box)),
               buffer_dtype(self.tensors[t.tensor], t),
               region(self.source(t.tensor), t.box, self.lp.src_box[t.tensor]),
               self.held_dtype(t.tensor))
        return buf

    def scratch(self, st: StepTask, n: int) -> Any:
        """The task's own ``n``-element region of the scratch buffer, seen as the task's
        buffer dtype (:func:`buffer_dtype`)."""
        return self.lp.region(st.offset, n, buffer_dtype(self.tensors[st.task.tensor], st.task))

    def receives(self, t: Task) -> bool:
        """This device receives ``t``'s box for its destination (not its root, a relay
        or an addend)."""
        d = self.device
        return t.root != d and d not in t.through and d not in t.addends

    # ----- the step loop -----------------------------------------------------------------
    def run(self, blame: Blame) -> int:
        """Every step in order. Returns the bytes this device sent."""
        return sum(self.run_step(step, blame) for step in self.lp.steps)

    def run_step(self, step: tuple[StepTask, ...], blame: Blame) -> int:
        """This device's tasks of one step: prepared, issued as one group, unpacked
        (the module docstring's three phases). A coalesced message is issued as soon
        as its payloads are ready, in the step's order (a backend that starts operations
        as they are issued, gloo, sends it while the next ones are packed), every
        other task after all are ready, in the step's order: the same order on every
        device. A backend that batches a group (NCCL) launches them all at its end.
        Returns the bytes sent."""
        self.own_sources(step)
        ops: list[Op] = []
        later: list[Op] = []
        backend = self.backend
        opened = False
        for st in step:
            if st.follows:  # travels in its message, which its first task issues
                continue
            with blame(st):
                op: Op | None = self.messages.prepare(st, step) if st.message else \
                    KINDS[st.task.kind].prepare(self, st)
            if op is None:
                continue
            ops.append(op)
            if not st.message:
                later.append(op)
                continue
            if not opened:
                backend.group_start()
                opened = True
            with blame(st):
                KINDS[op.task.kind].issue(self, op)
        self.batch.flush()  # the packs of every task not issued yet, one launch
        if later and not opened:
            backend.group_start()
            opened = True
        for op in later:
            with blame(op.st):
                KINDS[op.task.kind].issue(self, op)
        if not opened:
            return 0
        with blame(*(op.st for op in ops), step=True):
            backend.group_end()
        for op in ops:
            with blame(op.st):
                if op.unpacks is not None:
                    op.unpacks.finish()
                elif not op.st.message:
                    KINDS[op.task.kind].unpack(self, op)
        self.batch.flush()
        return sum(op.sent for op in ops)


__all__ = ["Blame", "Execution"]

"""One device's execution of a loaded program: the three phases of every step.

Execution follows the plan's steps (tasks with the same ``step``, contiguous in plan
order). A device may take part in several tasks of one step, and no task reads what
another task of its step writes, so a device runs each of its steps in three phases:

1. prepare: copies (``COPY``) are done at once; every other task gets its buffers:
   send data packed from the shard (zero-copy when contiguous), a receive target
   (the destination shard itself when contiguous), each task in its own region of
   the program's scratch buffer (one byte buffer for every dtype, sized when the
   program is loaded for the step that needs most); a ``REDUCE`` root first takes a
   private copy of its source shard (once per tensor), so the caller's data stays
   untouched;
2. issue: every task's operation in plan order between ``group_start`` and
   ``group_end`` (one NCCL group; gloo's asynchronous operations), tagged with the
   task's index in the plan, so they may all be in flight at once; ``group_end``
   returns once they completed (a host-memory backend) or are ordered before later
   work (a stream backend);
3. unpack: received data into the destination shard, reduced sums into the root's
   source copy, all-gathered rows into the destination shard, in plan order (a
   backend that reports a broadcast's pieces as they land has had most of a
   scratch-received box copied into place during phase 2 already).

A coalesced message (:mod:`reshard.planner.schedule.coalesce`) is one operation of its first
task: its payloads lie back to back in one scratch region (:class:`MessageLayout`,
made on the first run); the root copies strided boxes in run by run, a receiver copies
them out as their bytes land, and on a backend that gathers
(``Capabilities.gathers``) boxes that are one run of their shard move straight from
and into it, the message then being the list of its parts.

The device starts its next step only after this one. Each phase dispatches on the
task kind through a table of handlers (:data:`_PREPARE`, :data:`_ISSUE`,
:data:`_UNPACK`). Plans whose steps have one task per device run exactly as one
blocking operation per task.

Buffers are whatever the backend's ranks use (numpy, cupy or torch arrays): this
module only slices, reshapes and assigns them, and allocates through the backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import Any, cast

from reshard.bits import assign
from reshard.casting import convert_into, quantize_into
from reshard.comm.backend import AllReducing
from reshard.comm.box_batch import BoxBatch
from reshard.comm.derived import DERIVE
from reshard.comm.packing import (
    Unpacker,
    is_contiguous,
    pack,
    recv_target,
    region,
    same_memory,
    unpack,
)
from reshard.comm.pitched import copy_into
from reshard.comm.step_ops import MessageSink, Op, flat_bytes
from reshard.comm.steps import LoadedProgram, MessageLayout, MessagePiece, StepTask
from reshard.dtypes import ScaleMode, block_shape, parse_dtype
from reshard.layout import Box, box_size
from reshard.planner.schedule.staging import buffer_dtype
from reshard.planner.values.tasks import Buffer, Task, TaskKind

Blame = Callable[..., AbstractContextManager[None]]
"""``blame(*step_tasks, step=False)``: a context that turns errors of its body into
errors naming those tasks (or the step)."""


class Execution:
    """One execution of a loaded program on one device: its shards, and the handlers
    of each phase per task kind (the tables below the class).

    Sources the plan derives (a scaled cast's amax and scales, see
    :mod:`reshard.planner.values.scales`) are computed when first read, by
    :data:`reshard.comm.derived.DERIVE`.

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
        self._held: dict[int, tuple[Any, Any] | None] = {}  # tensor -> _hold's
        self._into: dict[int, Any] = {}  # tensor -> its destination shard's bytes
        self._converts: dict[int, bool] = {}  # tensor -> converts(tensor), until private
        self.scale_values_of: dict[int, Any] = {}  # scales tensor -> its float32 values here
        self.batch = BoxBatch()  # a step's GPU box copies, one launch before they are read

    # ----- sources ---------------------------------------------------------------------
    def source(self, i: int) -> Any:
        """This device's source shard of tensor ``i`` (derived on first use)."""
        shard = self.src.get(i)
        if shard is None:
            shard = self.src[i] = DERIVE[self.tensors[i].derive](self, i)
        return shard

    def scale_values(self, k: int) -> Any:
        """Scales tensor ``k``'s source shard here as float32 values (what packing
        divides by; :mod:`reshard.comm.derived`)."""
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

    def pack_source(self, st: StepTask, shard: Any, shard_box: Box, n: int) -> Any:
        """The task's box of a source shard as a 1-d buffer of the wire's dtype: a view
        where it is already contiguous and converts nothing, else a (converted) copy in
        the task's scratch region."""
        t = st.task
        if not self.converts(t.tensor):
            return pack(shard, t.box, shard_box, self._scratch(st, n), self.batch)
        buf = self._scratch(st, n)
        self.convert_into(buf, region(shard, t.box, shard_box), t.tensor, t.box)
        return buf

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
                op: Op | None = self.prepare_message(st, step) if st.message else \
                    _PREPARE[st.task.kind](self, st)
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
                _ISSUE[op.task.kind](self, op)
        self.batch.flush()  # the packs of every task not issued yet, one launch
        if later and not opened:
            backend.group_start()
            opened = True
        for op in later:
            with blame(op.st):
                _ISSUE[op.task.kind](self, op)
        if not opened:
            return 0
        with blame(*(op.st for op in ops), step=True):
            backend.group_end()
        for op in ops:
            with blame(op.st):
                if op.unpacks is not None:
                    op.unpacks.finish()
                elif not op.st.message:
                    _UNPACK[op.task.kind](self, op)
        self.batch.flush()
        return sum(op.sent for op in ops)

    @property
    def _lands(self) -> bool:
        """The backend reports a receive's pieces as they land."""
        return bool(self.caps.lands_pieces)

    def _receives(self, t: Task) -> bool:
        """This device receives ``t``'s box for its destination (not its root, a relay
        or an addend)."""
        d = self.device
        return t.root != d and d not in t.through and d not in t.addends

    def _hold(self, i: int) -> tuple[Any, Any] | None:
        """Tensor ``i``'s source shard here and its bytes (:func:`_flat_bytes`), for a
        root's payloads of it; None where the wire carries it converted. Kept for the
        run (until its shard is made private)."""
        got = None
        if not self.converts(i):
            shard = self.source(i)
            got = (shard, flat_bytes(shard))
        self._held[i] = got
        return got

    def prepare_message(self, st: StepTask, step: Sequence[StepTask]) -> Op:
        """A coalesced message (whose tasks never sum addends), as one operation of its
        first task: the root copies each payload from its shard into the message's
        scratch region, a receiver receives there and unpacks each payload as it lands
        (a relay only passes it on). On a backend that gathers
        (``Capabilities.gathers``), a payload that is one contiguous run of its shard
        is sent from there or received straight into it instead: the message is the
        list of its parts (runs of the region between such payloads)."""
        lay = self.lp.message(st, step)
        region, total = lay.region, st.message
        parts: list[Any] = []
        sink = None
        if st.task.root == self.device:
            run = self._message_out(lay, parts)
            sent = total
        else:
            run, sink = self._message_in(st.task, lay, parts)
            sent = 0
        self.batch.flush()  # the root's payloads, before the message is issued
        if run == 0:
            buf = region
        else:
            if run > 0:
                parts.append(region[run:total])
            buf = parts
        return Op(st, buf, sent=sent, sink=sink if self._lands else None, unpacks=sink)

    def _message_out(self, lay: MessageLayout, parts: list[Any]) -> int:
        """The root's side of :meth:`prepare_message`: each payload copied into the
        region, or sent from its shard (``parts``, filled in); returns where the open
        run of region-held payloads starts (-1: none)."""
        region, run, gathers, held = lay.region, -1, self.caps.gathers, self._held
        for p in lay.pieces:
            got = (held[p.tensor] if p.tensor in held else self._hold(p.tensor)) \
                if p.plain else None
            direct = None
            if got is not None:  # the root's box of its source shard, as is
                shard, whole = got
                if whole is not None and p.rows:
                    p.packed_rows[...] = p.runs_in(whole)
                elif whole is not None and gathers and p.span:
                    direct = whole[p.span[0]:p.span[1]]
                else:
                    copy_into(p.shaped, shard[p.slices], self.batch)
            else:  # converted, or a relay's box from its destination
                op = _PREPARE[p.st.task.kind](self, p.st)
                if op is not None and not same_memory(op.buf, p.flat):
                    self.batch.flush()  # op.buf may be a queued copy's target
                    if gathers:
                        direct = op.buf
                    else:
                        p.flat[...] = op.buf
            if direct is None:
                if run < 0:
                    run = p.start
                continue
            if run >= 0:
                parts.append(region[run:p.start])
                run = -1
            parts.append(direct)
        return run

    def _message_in(self, t: Task, lay: MessageLayout, parts: list[Any]
                    ) -> tuple[int, MessageSink | None]:
        """A receiver's side of :meth:`prepare_message`: payloads received into the
        region and unpacked as they land, or straight into the shard (``parts``, filled
        in); returns where the open run of region-held payloads starts (-1: none), and
        what unpacks them."""
        region, run, gathers = lay.region, -1, self.caps.gathers
        unpack: list[tuple[MessagePiece, Any]] = []
        receives = self._receives(t)
        dst, into = self.dst, self._into
        for p in lay.pieces:
            if receives:
                whole = into.get(p.tensor, False)
                if whole is False:
                    whole = into[p.tensor] = flat_bytes(dst[p.tensor])
                if gathers and p.span and whole is not None:
                    if run >= 0:
                        parts.append(region[run:p.start])
                        run = -1
                    parts.append(whole[p.span[0]:p.span[1]])
                    continue
                unpack.append((p, whole if p.rows else None))
            if run < 0:
                run = p.start
        return run, (MessageSink(dst, unpack, self.batch) if unpack else None)

    def own_sources(self, step: Sequence[StepTask]) -> None:
        """Before a step: a REDUCE root (or a broadcast's that sums addends) sums into
        a private copy of its source shard (one per tensor), never into the caller's
        array."""
        for st in self.lp.owners(step):
            t = st.task
            if t.tensor not in self._private:
                shard = self.source(t.tensor)
                pt = self.tensors[t.tensor]
                acc = pt.sum_dtype or pt.dtype
                copy = self.backend.empty(math.prod(shard.shape), parse_dtype(acc))
                copy = copy.reshape(tuple(shard.shape))
                assign(copy, acc, shard, pt.dtype)  # into the accumulator: exact
                self.src[t.tensor] = copy
                self._private.add(t.tensor)
                self._converts.pop(t.tensor, None)
                self._held.pop(t.tensor, None)

    def _addend(self, st: StepTask) -> Any:
        """A copy of this device's source box of the task in the task's scratch region
        (an addend that a reduction sums into; in its accumulator)."""
        t = st.task
        buf = self._scratch(st, box_size(t.box))
        assign(buf.reshape(tuple(hi - lo for lo, hi in t.box)),
               buffer_dtype(self.tensors[t.tensor], t),
               region(self.source(t.tensor), t.box, self.lp.src_box[t.tensor]),
               self.held_dtype(t.tensor))
        return buf

    def _scratch(self, st: StepTask, n: int) -> Any:
        """The task's own ``n``-element region of the scratch buffer, seen as the task's
        buffer dtype (:func:`buffer_dtype`)."""
        return self.lp.region(st.offset, n, buffer_dtype(self.tensors[st.task.tensor], st.task))

    # ----- prepare: copies done, buffers ready (None: nothing to issue) -----------------
    def prepare_copy(self, st: StepTask) -> Op | None:
        """COPY: done here (converted as the wire would); nothing to issue."""
        t, lp = st.task, self.lp
        i = t.tensor
        into = region(self.dst[i], t.box, lp.dst_box[i])
        values = region(self.source(i), t.box, lp.src_box[i])
        if self.converts(i):
            self.convert_into(into, values, i, t.box)
        else:
            copy_into(into, values, self.batch)
        return None

    def prepare_transfer(self, st: StepTask) -> Op | None:
        """SEND and BROADCAST: the root packs its box (of a sum: its private copy, which
        the backend sums into); an addend copies its own into scratch (summed into on
        the way); a receiver picks its target."""
        t, lp = st.task, self.lp
        i, n = t.tensor, box_size(t.box)
        if self.device in t.addends:
            buf = self._addend(st)
            return Op(st, buf, sent=n * buf.itemsize)
        if t.root == self.device:
            if t.source is Buffer.SRC:
                buf = self.pack_source(st, self.source(i), lp.src_box[i], n)
            else:  # a relay of what this device received in an earlier step
                buf = pack(self.dst[i], t.box, lp.dst_box[i], self._scratch(st, n), self.batch)
            return Op(st, buf, sent=n * buf.itemsize)
        if self.device in t.through:  # a relay: scratch in, passed on, kept nowhere
            return Op(st, self._scratch(st, n))
        buf = recv_target(self.dst[i], t.box, lp.dst_box[i], self._scratch(st, n))
        op = Op(st, buf)
        if self.caps.lands_pieces and \
                not is_contiguous(region(self.dst[i], t.box, lp.dst_box[i])):
            op.sink = Unpacker(self.dst[i], t.box, lp.dst_box[i], buf)  # into scratch
        return op

    def prepare_reduce(self, st: StepTask) -> Op | None:
        """Every member's addend into its scratch region (reduced in place)."""
        t = st.task
        buf = self._addend(st)
        return Op(st, buf, sent=0 if t.root == self.device else box_size(t.box) * buf.itemsize)

    def prepare_gather(self, st: StepTask) -> Op | None:
        """This device's piece into its input row; the rows behind it."""
        t = st.task
        k, m = len(t.group), max(box_size(p) for p in t.pieces)
        scratch = self._scratch(st, m * (k + 1))
        inp, rows = scratch[:m], scratch[m:].reshape(k, m)
        mine = dict(zip(t.receivers, t.pieces))[self.device]
        pn = box_size(mine)
        if pn:  # one copy, straight from the shard (a strided view's reshape is another)
            view = region(self.dst[t.tensor], mine, self.lp.dst_box[t.tensor])
            copy_into(inp[:pn].reshape(view.shape), view, self.batch)
        return Op(st, inp, rows, sent=pn * inp.itemsize * (k - 1))

    def prepare_allreduce(self, st: StepTask) -> Op | None:
        """ALLREDUCE: this member's addend, summed in place: in its destination shard
        where the sum lands there and needs no conversion (a contiguous box), else in
        its scratch region. A backend without an all-reduce runs the second of its
        parts here (the first, a REDUCE, ran in the step's first half): the first
        member packs the sum from its private source copy, the others receive it into
        scratch."""
        t, lp = st.task, self.lp
        i, n = t.tensor, box_size(t.box)
        pt = self.tensors[i]
        if t.root == self.device:
            buf = pack(self.src[i], t.box, lp.src_box[i], self._scratch(st, n), self.batch)
            return Op(st, buf, sent=buf.nbytes)
        if t.root >= 0:
            return Op(st, self._scratch(st, n))
        k = len(t.receivers)
        if self.lp.delivers(t) and (pt.sum_dtype or pt.dtype) == pt.out_dtype:
            into = region(self.dst[i], t.box, lp.dst_box[i])
            if is_contiguous(into):
                assign(into, pt.out_dtype, region(self.source(i), t.box, lp.src_box[i]),
                       self.held_dtype(i))
                op = Op(st, into.reshape(-1), sent=2 * (k - 1) * into.nbytes // k)
                op.rows = into  # in place: nothing to unpack
                return op
        buf = self._addend(st)
        return Op(st, buf, sent=2 * (k - 1) * buf.nbytes // k)

    # ----- issue: inside the step's group, tagged with the task's index ----------------
    def issue_send(self, op: Op) -> None:
        """SEND: the root sends, the receiver receives."""
        t = op.task
        if t.root == self.device:
            self.backend.send(op.buf, t.receivers[0], tag=op.st.index)
            return
        # a sink only on backends that report landed pieces (Capabilities.lands_pieces)
        self.backend.recv(op.buf, t.root, tag=op.st.index,
                          landed=None if op.sink is None else op.sink.upto)

    def issue_broadcast(self, op: Op) -> None:
        """BROADCAST: the receivers in chain order, and a tree's parents (for backends
        that pipeline a chain or tree)."""
        t = op.task
        # addends only on backends that fuse sums (else program_steps split the task);
        # a sink only on backends that report landed pieces
        self.backend.broadcast(op.buf, t.root, t.group, chain=t.receivers, tag=op.st.index,
                               parents=t.parents or None, addends=t.addends,
                               addend_parents=t.addend_parents or None,
                               landed=None if op.sink is None else op.sink.upto)

    def issue_reduce(self, op: Op) -> None:
        """REDUCE: summed (an amax: maxed) into the root's buffer."""
        t = op.task
        self.backend.reduce(op.buf, t.root, t.group, op=self.tensors[t.tensor].reduce_op)

    def issue_allreduce(self, op: Op) -> None:
        """ALLREDUCE: summed (an amax: maxed) into every member's buffer; without the
        backend's all-reduce, the sum broadcast from the first member."""
        t = op.task
        if t.root < 0:
            cast(AllReducing, self.backend).all_reduce(op.buf, t.group,
                                                       op=self.tensors[t.tensor].reduce_op)
        else:
            self.backend.broadcast(op.buf, t.root, t.group, chain=t.receivers,
                                   tag=op.st.index)

    def issue_gather(self, op: Op) -> None:
        """ALLGATHER: every member's piece into every member's rows."""
        self.backend.all_gather(op.rows, op.buf, op.task.group)

    # ----- unpack: after the group completed ----------------------------------------
    def unpack_received(self, op: Op) -> None:
        """SEND and BROADCAST: a receiver's box into its destination shard; the root of
        a sum keeps the sum in its private source copy."""
        t = op.task
        if op.sink is not None:
            op.sink.finish()
        elif t.addends and t.root == self.device:
            unpack(self.src[t.tensor], t.box, self.lp.src_box[t.tensor], op.buf, self.batch)
        elif self._receives(t):
            unpack(self.dst[t.tensor], t.box, self.lp.dst_box[t.tensor], op.buf, self.batch)

    def unpack_reduced(self, op: Op) -> None:
        """The root's sum into its (private) source shard."""
        t = op.task
        if t.root == self.device:
            unpack(self.src[t.tensor], t.box, self.lp.src_box[t.tensor], op.buf, self.batch)

    def unpack_allreduced(self, op: Op) -> None:
        """Every member's sum into its destination shard where it lands there (converted
        to the destination dtype), else into its private source copy (the broadcast's
        root of a backend without an all-reduce has it there already)."""
        t = op.task
        if op.rows is not None:  # summed in place in the destination
            return
        i = t.tensor
        if self.lp.delivers(t):
            values = region(self.src[i], t.box, self.lp.src_box[i]) if t.root == self.device \
                else op.buf.reshape(tuple(hi - lo for lo, hi in t.box))
            pt = self.tensors[i]
            convert_into(region(self.dst[i], t.box, self.lp.dst_box[i]), values,
                         pt.out_dtype, pt.sum_dtype or pt.dtype)
        elif t.root != self.device:
            unpack(self.src[i], t.box, self.lp.src_box[i], op.buf, self.batch)

    def unpack_gathered(self, op: Op) -> None:
        """The other members' pieces into the destination shard."""
        t = op.task
        piece_of = dict(zip(t.receivers, t.pieces))
        for row, member in enumerate(t.group):
            piece = piece_of[member]
            if member != self.device and box_size(piece):
                unpack(self.dst[t.tensor], piece, self.lp.dst_box[t.tensor], op.rows[row],
                       self.batch)


_PREPARE: Mapping[TaskKind, Callable[[Execution, StepTask], Op | None]] = MappingProxyType({
    TaskKind.COPY: Execution.prepare_copy,
    TaskKind.SEND: Execution.prepare_transfer,
    TaskKind.BROADCAST: Execution.prepare_transfer,
    TaskKind.REDUCE: Execution.prepare_reduce,
    TaskKind.ALLGATHER: Execution.prepare_gather,
    TaskKind.ALLREDUCE: Execution.prepare_allreduce,
})
"""Phase 1 per task kind: do a copy, or make the task's buffers ready."""

_ISSUE: Mapping[TaskKind, Callable[[Execution, Op], None]] = MappingProxyType({
    TaskKind.SEND: Execution.issue_send,
    TaskKind.BROADCAST: Execution.issue_broadcast,
    TaskKind.REDUCE: Execution.issue_reduce,
    TaskKind.ALLGATHER: Execution.issue_gather,
    TaskKind.ALLREDUCE: Execution.issue_allreduce,
})
"""Phase 2 per task kind: start the task's operation inside the step's group."""

_UNPACK: Mapping[TaskKind, Callable[[Execution, Op], None]] = MappingProxyType({
    TaskKind.SEND: Execution.unpack_received,
    TaskKind.BROADCAST: Execution.unpack_received,
    TaskKind.REDUCE: Execution.unpack_reduced,
    TaskKind.ALLGATHER: Execution.unpack_gathered,
    TaskKind.ALLREDUCE: Execution.unpack_allreduced,
})
"""Phase 3 per task kind: received data into place once the group completed."""



__all__ = ["Blame", "Execution"]

"""Each task kind's part in a step: one small class per kind with its three phases.

A step runs on a device in three phases (:mod:`reshard.comm.engine.execution`):

1. ``prepare``: a copy (``COPY``) is done at once; every other task gets its buffers:
   send data packed from the shard (zero-copy when contiguous), a receive target (the
   destination shard itself when contiguous), each task in its own region of the
   program's scratch buffer; returns the task's :class:`Op` (None: nothing to issue);
2. ``issue``: the task's operation, inside the step's group, tagged with the task's
   index in the plan;
3. ``unpack``: once the group completed, what was received into place.

:data:`KINDS` maps every :class:`~reshard.planner.values.tasks.TaskKind` to its class; a
new kind is a class here and a row there. The kinds read the running execution through
:class:`Running` (a protocol: nothing here imports the execution).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol, cast

from reshard.comm.backend import AllReducing, Backend, Capabilities
from reshard.comm.engine.box_batch import BoxBatch
from reshard.comm.engine.packing import Unpacker, is_contiguous, pack, recv_target, region, unpack
from reshard.comm.engine.pitched import copy_into
from reshard.comm.engine.step_ops import Op
from reshard.comm.engine.steps import LoadedProgram, StepTask
from reshard.comm.program import ProgramTensor
from reshard.core.bits import assign
from reshard.core.casting import convert_into
from reshard.core.layout import Box, box_size
from reshard.planner.values.tasks import Buffer, Task, TaskKind


class Running(Protocol):
    """What a task kind reads of the execution running its step on one device
    (:class:`reshard.comm.engine.execution.Execution` is the one)."""

    device: int
    lp: LoadedProgram
    backend: Backend
    caps: Capabilities
    tensors: tuple[ProgramTensor, ...]
    src: dict[int, Any]
    dst: dict[int, Any]
    batch: BoxBatch

    def source(self, i: int) -> Any:
        """Tensor ``i``'s source shard here (derived on first read)."""
        ...

    def converts(self, i: int) -> bool:
        """Tensor ``i``'s source shard here is not what the wire carries."""
        ...

    def convert_into(self, out: Any, values: Any, i: int, box: Box) -> None:
        """``out[...] = values`` as the wire carries tensor ``i``."""
        ...

    def held_dtype(self, i: int) -> str:
        """The dtype tensor ``i``'s source shard holds here."""
        ...

    def pack_source(self, st: StepTask, shard: Any, shard_box: Box, n: int) -> Any:
        """The task's box of a source shard as a 1-d buffer of the wire's dtype."""
        ...

    def addend(self, st: StepTask) -> Any:
        """This device's source box of the task, in its scratch region (an addend)."""
        ...

    def scratch(self, st: StepTask, n: int) -> Any:
        """The task's own ``n``-element scratch region."""
        ...

    def receives(self, t: Task) -> bool:
        """This device receives ``t``'s box for its destination."""
        ...


class Kind:
    """A task kind's three phases; a kind without one inherits the no-op."""

    def prepare(self, ex: Running, st: StepTask) -> Op | None:
        """Phase 1: do a copy, or make the task's buffers ready (None: nothing to issue)."""
        raise NotImplementedError

    def issue(self, ex: Running, op: Op) -> None:
        """Phase 2: start the task's operation inside the step's group."""

    def unpack(self, ex: Running, op: Op) -> None:
        """Phase 3: what was received into place, once the group completed."""


class Copy(Kind):
    """COPY: done in prepare (converted as the wire would); nothing to issue."""

    def prepare(self, ex: Running, st: StepTask) -> Op | None:
        t, lp = st.task, ex.lp
        i = t.tensor
        into = region(ex.dst[i], t.box, lp.dst_box[i])
        values = region(ex.source(i), t.box, lp.src_box[i])
        if ex.converts(i):
            ex.convert_into(into, values, i, t.box)
        else:
            copy_into(into, values, ex.batch)
        return None


class Transfer(Kind):
    """SEND and BROADCAST: the root packs its box (of a sum: its private copy, which the
    backend sums into); an addend copies its own into scratch (summed into on the way);
    a receiver picks its target, and unpacks into its destination shard."""

    def prepare(self, ex: Running, st: StepTask) -> Op | None:
        t, lp, me = st.task, ex.lp, ex.device
        i, n = t.tensor, box_size(t.box)
        if me in t.addends:
            buf = ex.addend(st)
            return Op(st, buf, sent=n * buf.itemsize)
        if t.root == me:
            if t.source is Buffer.SRC:
                buf = ex.pack_source(st, ex.source(i), lp.src_box[i], n)
            else:  # a relay of what this device received in an earlier step
                buf = pack(ex.dst[i], t.box, lp.dst_box[i], ex.scratch(st, n), ex.batch)
            return Op(st, buf, sent=n * buf.itemsize)
        if me in t.through:  # a relay: scratch in, passed on, kept nowhere
            return Op(st, ex.scratch(st, n))
        buf = recv_target(ex.dst[i], t.box, lp.dst_box[i], ex.scratch(st, n))
        op = Op(st, buf)
        if ex.caps.lands_pieces and \
                not is_contiguous(region(ex.dst[i], t.box, lp.dst_box[i])):
            op.sink = Unpacker(ex.dst[i], t.box, lp.dst_box[i], buf)  # into scratch
        return op

    def unpack(self, ex: Running, op: Op) -> None:
        """A receiver's box into its destination shard; the root of a sum keeps the sum
        in its private source copy."""
        t, lp = op.task, ex.lp
        if op.sink is not None:
            op.sink.finish()
        elif t.addends and t.root == ex.device:
            unpack(ex.src[t.tensor], t.box, lp.src_box[t.tensor], op.buf, ex.batch)
        elif ex.receives(t):
            unpack(ex.dst[t.tensor], t.box, lp.dst_box[t.tensor], op.buf, ex.batch)


class Send(Transfer):
    """SEND: the root sends, the receiver receives."""

    def issue(self, ex: Running, op: Op) -> None:
        t = op.task
        if t.root == ex.device:
            ex.backend.send(op.buf, t.receivers[0], tag=op.st.index)
            return
        # a sink only on backends that report landed pieces (Capabilities.lands_pieces)
        ex.backend.recv(op.buf, t.root, tag=op.st.index,
                        landed=None if op.sink is None else op.sink.upto)


class Broadcast(Transfer):
    """BROADCAST: the receivers in chain order, and a tree's parents (for backends that
    pipeline a chain or tree)."""

    def issue(self, ex: Running, op: Op) -> None:
        t = op.task
        # addends only on backends that fuse sums (else program_steps split the task);
        # a sink only on backends that report landed pieces
        ex.backend.broadcast(op.buf, t.root, t.group, chain=t.receivers, tag=op.st.index,
                             parents=t.parents or None, addends=t.addends,
                             addend_parents=t.addend_parents or None,
                             landed=None if op.sink is None else op.sink.upto)


class Reduce(Kind):
    """REDUCE: every member's addend in its scratch region, summed (an amax: maxed) into
    the root's, which unpacks it into its private source shard."""

    def prepare(self, ex: Running, st: StepTask) -> Op | None:
        t = st.task
        buf = ex.addend(st)
        return Op(st, buf, sent=0 if t.root == ex.device else box_size(t.box) * buf.itemsize)

    def issue(self, ex: Running, op: Op) -> None:
        t = op.task
        ex.backend.reduce(op.buf, t.root, t.group, op=ex.tensors[t.tensor].reduce_op)

    def unpack(self, ex: Running, op: Op) -> None:
        t = op.task
        if t.root == ex.device:
            unpack(ex.src[t.tensor], t.box, ex.lp.src_box[t.tensor], op.buf, ex.batch)


class Gather(Kind):
    """ALLGATHER: this device's piece into its input row, every member's piece into every
    member's rows, the others' pieces into the destination shard."""

    def prepare(self, ex: Running, st: StepTask) -> Op | None:
        t = st.task
        k, m = len(t.group), max(box_size(p) for p in t.pieces)
        scratch = ex.scratch(st, m * (k + 1))
        inp, rows = scratch[:m], scratch[m:].reshape(k, m)
        mine = dict(zip(t.receivers, t.pieces))[ex.device]
        pn = box_size(mine)
        if pn:  # one copy, straight from the shard (a strided view's reshape is another)
            view = region(ex.dst[t.tensor], mine, ex.lp.dst_box[t.tensor])
            copy_into(inp[:pn].reshape(view.shape), view, ex.batch)
        return Op(st, inp, rows, sent=pn * inp.itemsize * (k - 1))

    def issue(self, ex: Running, op: Op) -> None:
        ex.backend.all_gather(op.rows, op.buf, op.task.group)

    def unpack(self, ex: Running, op: Op) -> None:
        t = op.task
        piece_of = dict(zip(t.receivers, t.pieces))
        for row, member in enumerate(t.group):
            piece = piece_of[member]
            if member != ex.device and box_size(piece):
                unpack(ex.dst[t.tensor], piece, ex.lp.dst_box[t.tensor], op.rows[row],
                       ex.batch)


class AllReduce(Kind):
    """ALLREDUCE: every member's addend summed (an amax: maxed) into every member's
    buffer. A backend without an all-reduce runs it as its parts (a REDUCE into the
    first member in the step's first half, then this task as the broadcast of the sum
    from the first member: ``t.root >= 0``)."""

    def prepare(self, ex: Running, st: StepTask) -> Op | None:
        """This member's addend, summed in place: in its destination shard where the sum
        lands there and needs no conversion (a contiguous box), else in its scratch
        region; the broadcast part: the first member packs the sum from its private
        source copy, the others receive it into scratch."""
        t, lp = st.task, ex.lp
        i, n = t.tensor, box_size(t.box)
        pt = ex.tensors[i]
        if t.root == ex.device:
            buf = pack(ex.src[i], t.box, lp.src_box[i], ex.scratch(st, n), ex.batch)
            return Op(st, buf, sent=buf.nbytes)
        if t.root >= 0:
            return Op(st, ex.scratch(st, n))
        k = len(t.receivers)
        if lp.delivers(t) and (pt.sum_dtype or pt.dtype) == pt.out_dtype:
            into = region(ex.dst[i], t.box, lp.dst_box[i])
            if is_contiguous(into):
                assign(into, pt.out_dtype, region(ex.source(i), t.box, lp.src_box[i]),
                       ex.held_dtype(i))
                op = Op(st, into.reshape(-1), sent=2 * (k - 1) * into.nbytes // k)
                op.rows = into  # in place: nothing to unpack
                return op
        buf = ex.addend(st)
        return Op(st, buf, sent=2 * (k - 1) * buf.nbytes // k)

    def issue(self, ex: Running, op: Op) -> None:
        t = op.task
        if t.root < 0:
            cast(AllReducing, ex.backend).all_reduce(op.buf, t.group,
                                                     op=ex.tensors[t.tensor].reduce_op)
        else:
            ex.backend.broadcast(op.buf, t.root, t.group, chain=t.receivers,
                                 tag=op.st.index)

    def unpack(self, ex: Running, op: Op) -> None:
        """The sum into the destination shard where it lands there (converted to the
        destination dtype), else into the private source copy (the broadcast's root has
        it there already)."""
        t, lp = op.task, ex.lp
        if op.rows is not None:  # summed in place in the destination
            return
        i = t.tensor
        if lp.delivers(t):
            values = region(ex.src[i], t.box, lp.src_box[i]) if t.root == ex.device \
                else op.buf.reshape(tuple(hi - lo for lo, hi in t.box))
            pt = ex.tensors[i]
            convert_into(region(ex.dst[i], t.box, lp.dst_box[i]), values,
                         pt.out_dtype, pt.sum_dtype or pt.dtype)
        elif t.root != ex.device:
            unpack(ex.src[i], t.box, lp.src_box[i], op.buf, ex.batch)


KINDS: Mapping[TaskKind, Kind] = MappingProxyType({
    TaskKind.COPY: Copy(),
    TaskKind.SEND: Send(),
    TaskKind.BROADCAST: Broadcast(),
    TaskKind.REDUCE: Reduce(),
    TaskKind.ALLGATHER: Gather(),
    TaskKind.ALLREDUCE: AllReduce(),
})
"""Each task kind's phases (``tests/unit/test_engine_kinds.py`` holds it to cover every
kind)."""


__all__ = ["KINDS", "AllReduce", "Broadcast", "Copy", "Gather", "Kind", "Reduce", "Running",
           "Send", "Transfer"]

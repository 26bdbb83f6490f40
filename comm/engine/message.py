"""A coalesced message on one device, made ready as one operation of its first task.

A coalesced message (:mod:`reshard.planner.schedule.coalesce`) carries several small
tasks between the same devices (whose tasks never sum addends): its payloads lie back
to back in one scratch region (:class:`~reshard.comm.engine.steps.MessageLayout`, made
on the first run); the root copies strided boxes in run by run, a receiver copies them
out as their bytes land (:class:`~reshard.comm.engine.step_ops.MessageSink`), a relay
only passes them on. On a backend that gathers (``Capabilities.gathers``) a payload
that is one contiguous run of its shard moves straight from and into it, the message
then being the list of its parts (runs of the region between such payloads).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reshard.comm.engine.kinds import KINDS, Running
from reshard.comm.engine.packing import same_memory
from reshard.comm.engine.pitched import copy_into
from reshard.comm.engine.step_ops import MessageSink, Op, flat_bytes
from reshard.comm.engine.steps import MessageLayout, MessagePiece, StepTask
from reshard.planner.values.tasks import Task


class Messages:
    """One execution's coalesced messages on one device, with what they keep for the run:
    each tensor's source shard and its bytes (a root's payloads of it, :meth:`forget`
    once the shard is made private) and each destination shard's bytes.

    Args:
        ex: the execution.
    """

    def __init__(self, ex: Running) -> None:
        self.ex = ex
        self._held: dict[int, tuple[Any, Any] | None] = {}  # tensor -> _hold's
        self._into: dict[int, Any] = {}  # tensor -> its destination shard's bytes

    def forget(self, i: int) -> None:
        """Tensor ``i``'s source shard was replaced (by a private copy)."""
        self._held.pop(i, None)

    def prepare(self, st: StepTask, step: Sequence[StepTask]) -> Op:
        """The message ``st`` issues (``step``: its step) as one operation of ``st``."""
        ex = self.ex
        lay = ex.lp.message(st, step)
        region, total = lay.region, st.message
        parts: list[Any] = []
        sink = None
        if st.task.root == ex.device:
            run = self._out(lay, parts)
            sent = total
        else:
            run, sink = self._in(st.task, lay, parts)
            sent = 0
        ex.batch.flush()  # the root's payloads, before the message is issued
        if run == 0:
            buf = region
        else:
            if run > 0:
                parts.append(region[run:total])
            buf = parts
        return Op(st, buf, sent=sent, sink=sink if ex.caps.lands_pieces else None,
                  unpacks=sink)

    def _hold(self, i: int) -> tuple[Any, Any] | None:
        """Tensor ``i``'s source shard here and its bytes (:func:`flat_bytes`), for a
        root's payloads of it; None where the wire carries it converted."""
        got = self._held.get(i, False)
        if got is False:
            got = None
            if not self.ex.converts(i):
                shard = self.ex.source(i)
                got = (shard, flat_bytes(shard))
            self._held[i] = got
        return got  # type: ignore[return-value]

    def _out(self, lay: MessageLayout, parts: list[Any]) -> int:
        """The root's side: each payload copied into the region, or sent from its shard
        (``parts``, filled in); returns where the open run of region-held payloads
        starts (-1: none)."""
        ex = self.ex
        region, run, gathers = lay.region, -1, ex.caps.gathers
        for p in lay.pieces:
            got = self._hold(p.tensor) if p.plain else None
            direct = None
            if got is not None:  # the root's box of its source shard, as is
                shard, whole = got
                if whole is not None and p.rows:
                    p.packed_rows[...] = p.runs_in(whole)
                elif whole is not None and gathers and p.span:
                    direct = whole[p.span[0]:p.span[1]]
                else:
                    copy_into(p.shaped, shard[p.slices], ex.batch)
            else:  # converted, or a relay's box from its destination
                op = KINDS[p.st.task.kind].prepare(ex, p.st)
                if op is not None and not same_memory(op.buf, p.flat):
                    ex.batch.flush()  # op.buf may be a queued copy's target
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

    def _in(self, t: Task, lay: MessageLayout, parts: list[Any]
            ) -> tuple[int, MessageSink | None]:
        """A receiver's side: payloads received into the region and unpacked as they
        land, or straight into the shard (``parts``, filled in); returns where the open
        run of region-held payloads starts (-1: none), and what unpacks them."""
        ex = self.ex
        region, run, gathers = lay.region, -1, ex.caps.gathers
        unpack: list[tuple[MessagePiece, Any]] = []
        receives = ex.receives(t)
        dst, into = ex.dst, self._into
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
        return run, (MessageSink(dst, unpack, ex.batch) if unpack else None)


__all__ = ["Messages"]

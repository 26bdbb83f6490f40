"""What a step of the execution holds for one task while it runs
(:mod:`reshard.comm.engine.execution`): the task's :class:`Op` (its buffers, what it sends,
how what it receives is unpacked) and a coalesced message's :class:`MessageSink`
(payloads unpacked as the bytes that cover them land)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from reshard.comm.engine.box_batch import BoxBatch
from reshard.comm.engine.packing import Unpacker
from reshard.comm.engine.pitched import copy_into
from reshard.comm.engine.steps import MessagePiece, StepTask
from reshard.planner.values.tasks import Task


@dataclass(slots=True)
class Op:
    """A task of the running step on this device, with its buffers (or a coalesced
    message, under its first task).

    Attributes:
        st: the task.
        buf: SEND / BROADCAST: the packed data (root) or the receive target; REDUCE:
            this device's addend (the sum, at the root); ALLGATHER: this device's piece.
            A coalesced message: its scratch region, or (a backend that gathers) the
            list of its parts.
        rows: ALLGATHER: the gathered rows, one per member.
        sent: bytes this device sends.
        sink: a SEND / BROADCAST receiver's box received into scratch, unpacked piece
            by piece as the backend reports them landed (backends that do); of a
            coalesced message, its payloads unpacked each as it lands.
        unpacks: a coalesced message's payloads to unpack (after the step: what its
            sink has not).
    """

    st: StepTask
    buf: Any
    rows: Any = None
    sent: int = 0
    sink: Unpacker | MessageSink | None = None
    unpacks: MessageSink | None = None

    @property
    def task(self) -> Task:
        """The task."""
        return self.st.task


class MessageSink:
    """A receiver's coalesced message: each payload received into scratch is unpacked
    into its destination as soon as the bytes landed so far cover it (the payloads lie
    back to back from the message's start), so unpacking one overlaps the arrival of
    the rest instead of following the whole step.

    Args:
        dst: tensor -> this device's destination shard.
        pieces: the payloads to unpack, in message order, each with its destination
            shard's bytes where it is copied run by run (else None).
        batch: where a GPU's copies of one :meth:`upto` wait for one launch (flushed
            before it returns).
    """

    __slots__ = ("batch", "done", "dst", "pieces")

    def __init__(self, dst: dict[int, Any], pieces: list[tuple[MessagePiece, Any]],
                 batch: BoxBatch | None = None) -> None:
        self.dst, self.pieces, self.batch = dst, pieces, batch
        self.done = 0

    def upto(self, nbytes: int) -> None:
        """Unpack every payload the message's first ``nbytes`` hold (a strided box of a
        C-contiguous shard, whose bytes come along, run by run)."""
        pieces, dst, k = self.pieces, self.dst, self.done
        while k < len(pieces) and pieces[k][0].end <= nbytes:
            p, whole = pieces[k]
            if whole is None:
                copy_into(dst[p.tensor][p.slices], p.shaped, self.batch)
            else:
                p.runs_in(whole)[...] = p.packed_rows
            k += 1
        self.done = k
        if self.batch is not None:
            self.batch.flush()

    def finish(self) -> None:
        """Unpack what is left."""
        self.upto(1 << 62)


def flat_bytes(shard: Any) -> Any:
    """A C-contiguous numpy shard's memory as flat bytes (a memoryview), else None."""
    if isinstance(shard, np.ndarray) and shard.flags.c_contiguous:
        return memoryview(shard.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    return None


__all__ = ["MessageSink", "Op", "flat_bytes"]

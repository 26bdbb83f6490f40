"""Fusing a partial sum's reduction with its delivery.

A partial source reduced in pieces and then broadcast runs in lockstep: a device
starts a step when all its tasks of the previous one ended, so every piece pays the
latency of its reduction and of its delivery, and the last piece's delivery trails
the last reduction (about ``(k + 1) / k`` of the time plus ``k`` latencies for ``k``
pieces: 1.27x the bound at best on a DGX H100 partial sum). A fused task sums and
delivers in one pipelined chain instead: the addends pass their running sum down to
the root piece by piece, and the root passes each summed piece on to the receivers at
once (see ``addends`` in :mod:`reshard.planner.ir`), so reduction and delivery overlap
at the granularity of the backend's pieces.

:func:`fuse_reductions` rewrites a plan's tasks so: each ``REDUCE`` whose sum is only
broadcast or sent on, in boxes that partition it, disappears into those transfers.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import replace

from reshard.layout import box_size, box_within, boxes_meet
from reshard.planner.values.tasks import Buffer, Task, TaskKind

_CARRIERS = (TaskKind.BROADCAST, TaskKind.SEND)


class SumShape(enum.Enum):
    """How a fused sum's addends pass their running sums to the root.

    ``CHAIN``: one after the other, ``addends[0] -> addends[1] -> ... -> root`` (every
    link carries the box once; one latency per addend). ``STAR``: each straight to the
    root (one latency; the root receives every addend's box at once). ``BINARY``: a
    binary tree over ``(root, *addends)`` in heap order (about log2 of the addends'
    latencies; a member receives at most two).
    """

    CHAIN = "chain"
    STAR = "star"
    BINARY = "binary"


def sum_parents(root: int, addends: Sequence[int], shape: SumShape) -> tuple[int, ...]:
    """Each addend's parent in a sum of this shape (:attr:`Task.addend_parents`; empty
    for a chain)."""
    if shape is SumShape.CHAIN:
        return ()
    if shape is SumShape.STAR:
        return (root,) * len(addends)
    nodes = (root, *addends)
    return tuple(nodes[(k - 1) // 2] for k in range(1, len(nodes)))


def fuse_reductions(tasks: Sequence[Task], fusable: Collection[int] | None = None,
                    shape: SumShape = SumShape.CHAIN) -> tuple[Task, ...]:
    """``tasks`` with every ``REDUCE`` whose sum only broadcasts and sends read (in
    disjoint boxes covering it exactly, none of them a relay's, already fused or
    delivering to one of its addends) replaced by those transfers summing its addends
    on the way; steps renumbered 0, 1, ... (a step left empty disappears). Other
    reductions stay as they are, and so do those of tensors not in ``fusable`` (None:
    every tensor; see :attr:`~reshard.planner.ir.TensorSpec.fuses`). The addends pass
    their running sums to the root in ``shape``."""
    reduces: dict[tuple[int, int], list[int]] = {}
    for i, t in enumerate(tasks):
        if t.kind is TaskKind.REDUCE and (fusable is None or t.tensor in fusable):
            reduces.setdefault((t.tensor, t.root), []).append(i)
    if not reduces:
        return tuple(tasks)
    readers: dict[int, list[int]] = {}
    blocked: set[int] = set()
    for j, t in enumerate(tasks):
        if t.kind is TaskKind.REDUCE or t.source is not Buffer.SRC:
            continue
        for r in reduces.get((t.tensor, t.root), ()):
            rt = tasks[r]
            if not boxes_meet(t.box, rt.box):
                continue
            if (t.kind in _CARRIERS and not t.addends and j > r and t.step > rt.step
                    and box_within(t.box, rt.box) and not set(t.receivers) & set(rt.receivers)):
                readers.setdefault(r, []).append(j)
            else:
                blocked.add(r)
    fused: dict[int, Task] = {}
    gone: set[int] = set()
    for r, js in readers.items():
        rt = tasks[r]
        if r in blocked or sum(box_size(tasks[j].box) for j in js) != box_size(rt.box) \
                or any(boxes_meet(tasks[a].box, tasks[b].box)
                       for n, a in enumerate(js) for b in js[n + 1:]):
            continue
        gone.add(r)
        parents = sum_parents(rt.root, rt.receivers, shape)
        for j in js:
            fused[j] = replace(tasks[j], kind=TaskKind.BROADCAST, addends=rt.receivers,
                               addend_parents=parents)
    kept = [fused.get(j, t) for j, t in enumerate(tasks) if j not in gone]
    steps = {s: n for n, s in enumerate(sorted({t.step for t in kept}))}
    return tuple(t.at_step(steps[t.step]) for t in kept)


__all__ = ["SumShape", "fuse_reductions", "sum_parents"]

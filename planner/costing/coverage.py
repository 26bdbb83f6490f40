"""Box geometry the plan verifier asks (:mod:`reshard.planner.costing.verify`): how many
elements two boxes share, whether boxes cover a box, whether they tile it exactly
(corner measures: an inclusion-exclusion over the boxes' corners, exact for any
number of boxes), and a pair of boxes that overlap, found by a sweep."""

from __future__ import annotations

import numpy as np

from reshard.layout import Box, box_size, box_within


def overlap(a: Box, b: Box) -> int:
    """Elements two boxes share."""
    n = 1
    for (lo1, hi1), (lo2, hi2) in zip(a, b):
        n *= max(0, min(hi1, hi2) - max(lo1, lo2))
        if not n:
            return 0
    return n


def covered(box: Box, boxes: list[Box], exact: set[Box]) -> bool:
    """True if disjoint ``boxes`` cover ``box`` (``exact``: the same boxes as a set)."""
    if box in exact:
        return True
    need = box_size(box)
    return sum(overlap(box, b) for b in boxes) >= need


def corner_measure(boxes: list[Box], ndim: int) -> dict[tuple[int, ...], int]:
    """The signed corners of a list of boxes: each box adds ``(-1)**k`` at each of its
    ``2**ndim`` corners, ``k`` the number of its upper bounds the corner takes (the
    boxes' indicator functions, summed, differenced along every dim). Differencing is
    invertible (prefix sums undo it), so two lists of boxes cover every element the same
    number of times exactly when their measures are equal: a list tiles a box exactly
    once when its measure is the box's own. O(boxes * 2**ndim log), never quadratic."""
    boxes = [b for b in boxes if box_size(b)]
    if not boxes:
        return {}
    if ndim == 0:
        return {(): len(boxes)}
    arr = np.asarray(boxes, dtype=np.int64).reshape(len(boxes), ndim, 2)
    masks = np.arange(1 << ndim)
    upper = (masks[:, None] >> np.arange(ndim)[None, :]) & 1  # (corners, ndim): 1 = hi
    coords = np.where(upper[None, :, :] == 1, arr[:, None, :, 1], arr[:, None, :, 0])
    signs = np.where(upper.sum(axis=1) % 2 == 1, -1, 1)
    flat = coords.reshape(-1, ndim)
    corners, inverse = np.unique(flat, axis=0, return_inverse=True)
    total = np.bincount(inverse.reshape(-1), weights=np.tile(signs, len(boxes)),
                        minlength=len(corners))
    keep = np.flatnonzero(total)
    return {tuple(corners[k].tolist()): int(total[k]) for k in keep}


SMALL_TILING = 8
"""Lists of at most this many boxes are checked pair by pair (cheaper than numpy's
set-up for the few boxes most devices receive)."""


def tiles(boxes: list[Box], box: Box, ndim: int) -> bool:
    """True if ``boxes`` cover every element of ``box`` exactly once and nothing else."""
    boxes = [b for b in boxes if box_size(b)]
    if _slabs(boxes, box):
        return True
    if len(boxes) <= SMALL_TILING:
        return (all(box_within(b, box) for b in boxes)
                and not any(overlap(a, b) for k, a in enumerate(boxes) for b in boxes[:k])
                and sum(map(box_size, boxes)) == box_size(box))
    return corner_measure(boxes, ndim) == corner_measure([box], ndim)


def _slabs(boxes: list[Box], box: Box) -> bool:
    """True if ``boxes`` cut ``box`` into slabs along one dim, end to end (what most
    shards receive; False: not of that form, which proves nothing). Sorting the slabs'
    spans is cheaper than comparing every pair."""
    for k, span in enumerate(box):
        rest = box[:k] + box[k + 1:]
        if all(b[:k] + b[k + 1:] == rest for b in boxes):
            at = span[0]
            for lo, hi in sorted(b[k] for b in boxes):
                if lo != at:
                    return False
                at = hi
            return at == span[1]
    return False


def find_overlap(boxes: list[Box], budget: int = 4_000_000) -> tuple[Box, Box] | None:
    """Two boxes of the list that share an element, found by a sweep along the dim
    whose starts separate the boxes most; None if none does, or if ``budget`` box
    comparisons did not find one (only called to name a pair a cheaper test already
    proved to exist)."""
    boxes = [b for b in boxes if box_size(b)]
    if len(boxes) < 2:
        return None
    dim = max(range(len(boxes[0])), key=lambda k: len({b[k][0] for b in boxes}), default=0)
    order = sorted(boxes, key=lambda b: b[dim] if b else ())
    active: list[Box] = []
    spent = 0
    for box in order:
        lo = box[dim][0] if box else 0
        active = [a for a in active if not box or a[dim][1] > lo]
        for a in active:
            spent += 1
            if overlap(a, box):
                return a, box
        if spent > budget:
            return None
        active.append(box)
    return None


__all__ = ["corner_measure", "covered", "find_overlap", "overlap", "tiles"]

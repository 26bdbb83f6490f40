"""Unit-slice decomposition.

Per tensor dim, the cut points of every source and destination box are merged; every
cell of the resulting grid is a unit slice with one set of source holders and one set
of destination needers. Neighbouring cells with equal holders and needers are then
merged, so a plan has as few transfers as the two layouts allow.

This module builds the grid one cell at a time (plain Python, the fastest for the
small grids of most tensors); :mod:`reshard.planner.cell_table` builds the same cells
with numpy, a column per property, for large grids.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reshard.layout import Box, Layout


@dataclass(frozen=True)
class Cell:
    """A box of the tensor with the devices that hold it and those that need it."""

    box: Box
    holders: frozenset[int]
    needers: frozenset[int]
    size: int = field(init=False, compare=False, repr=False)
    """Elements in the box (derived; computed once, the planner reads it per cell)."""

    def __post_init__(self) -> None:
        n = 1
        for lo, hi in self.box:
            n *= hi - lo
        object.__setattr__(self, "size", n)


def devices_by_box(layout: Layout, shape: tuple[int, ...],
                   only: frozenset[int] | None = None) -> dict[Box, frozenset[int]]:
    """Each distinct box of ``layout`` and the devices holding it (restricted to
    ``only`` when given, e.g. a partial layout's leaders)."""
    out: dict[Box, set[int]] = {}
    for d, b in layout.boxes(shape).items():
        if only is None or d in only:
            out.setdefault(b, set()).add(d)
    return {b: frozenset(s) for b, s in out.items()}


def pieces(boxes: Mapping[Box, frozenset[int]]) -> list[tuple[Box, frozenset[int]]]:
    """The non-empty boxes that some device holds (or needs), with those devices."""
    return [(b, devs) for b, devs in boxes.items() if all(hi > lo for lo, hi in b) and devs]


def decompose(
    shape: tuple[int, ...],
    holders: Mapping[Box, frozenset[int]],
    needers: Mapping[Box, frozenset[int]],
) -> list[Cell]:
    """Split a tensor into maximal cells of equal holders and needers.

    Args:
        shape: the global tensor shape.
        holders: each distinct source box and the devices holding its full value.
        needers: each distinct destination box and the devices that must receive it.

    Returns:
        Cells covering every element some device needs, in a deterministic order
        (row-major over the grid, then merged). Elements no one needs are left out.
    """
    if any(s == 0 for s in shape):
        return []
    src = pieces(holders)
    dst = pieces(needers)
    if not dst:
        return []
    ndim = len(shape)
    if ndim == 0:
        hold = frozenset().union(*(d for _, d in src)) if src else frozenset()
        need = frozenset().union(*(d for _, d in dst))
        return [Cell((), hold, need)]

    # Per dim: the intervals between merged cut points, and for each interval bitmasks
    # of the source / destination pieces covering it.
    axes: list[list[tuple[tuple[int, int], int, int]]] = []
    for d in range(ndim):
        cuts = {0, shape[d]}
        for b, _ in src:
            cuts.update(b[d])
        for b, _ in dst:
            cuts.update(b[d])
        pts = sorted(cuts)
        intervals = []
        for lo, hi in itertools.pairwise(pts):
            smask = 0
            for i, (b, _) in enumerate(src):
                if b[d][0] <= lo and hi <= b[d][1]:
                    smask |= 1 << i
            dmask = 0
            for i, (b, _) in enumerate(dst):
                if b[d][0] <= lo and hi <= b[d][1]:
                    dmask |= 1 << i
            if dmask:
                intervals.append(((lo, hi), smask, dmask))
        axes.append(intervals)

    src_sets = [devs for _, devs in src]
    dst_sets = [devs for _, devs in dst]
    union_cache: dict[tuple[int, int], frozenset[int]] = {}

    def devices_of(mask: int, sets: list[frozenset[int]], tag: int) -> frozenset[int]:
        key = (tag, mask)
        got = union_cache.get(key)
        if got is None:
            acc: set[int] = set()
            i = 0
            while mask:
                if mask & 1:
                    acc |= sets[i]
                mask >>= 1
                i += 1
            got = frozenset(acc)
            union_cache[key] = got
        return got

    # The grid's cells dim by dim, dropping a prefix as soon as no one needs it.
    partial: list[tuple[Box, int, int]] = [((), (1 << len(src)) - 1, -1)]
    for ax in axes:
        partial = [((*box, iv), smask & s, dmask & dm)
                   for box, smask, dmask in partial for iv, s, dm in ax if dmask & dm]
    cells = [Cell(box, devices_of(smask, src_sets, 0), devices_of(dmask, dst_sets, 1))
             for box, smask, dmask in partial]
    return merge_cells(cells, ndim)


def merge_cells(cells: list[Cell], ndim: int) -> list[Cell]:
    """Merge neighbouring cells with equal holders and needers, last dim first.

    Only cells that share holders and needers with another cell can merge; the rest
    (every cell of an all-to-all) pass through untouched.
    """
    buckets: dict[tuple[Any, ...], list[Cell]] = {}
    for c in cells:
        buckets.setdefault((c.holders, c.needers), []).append(c)
    if len(buckets) == len(cells):
        return sorted(cells, key=lambda c: c.box)
    alone = [b[0] for b in buckets.values() if len(b) == 1]
    cells = [c for b in buckets.values() if len(b) > 1 for c in b]
    for d in reversed(range(ndim)):
        groups: dict[tuple[Any, ...], list[Cell]] = {}
        for c in cells:
            key = (c.holders, c.needers, c.box[:d], c.box[d + 1:])
            groups.setdefault(key, []).append(c)
        merged: list[Cell] = []
        for group in groups.values():
            group.sort(key=lambda c: c.box[d][0])
            cur = group[0]
            for nxt in group[1:]:
                if nxt.box[d][0] == cur.box[d][1]:
                    box = (*cur.box[:d], (cur.box[d][0], nxt.box[d][1]), *cur.box[d + 1:])
                    cur = Cell(box, cur.holders, cur.needers)
                else:
                    merged.append(cur)
                    cur = nxt
            merged.append(cur)
        cells = merged
    cells += alone
    cells.sort(key=lambda c: c.box)
    return cells

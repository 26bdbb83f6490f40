"""A reduced partial source's cells of every step at once, as one numpy grid.

:func:`~reshard.planner.cells.reduce.decompose_pieces` decomposes the pieces reduced at
each step apart (a cell merged across two steps would wait for the later one), one
Python grid a step, then sorts the cells of every step by box. Where the pieces make a
large grid (:data:`~reshard.planner.cells.decompose.TABLE_FROM` pairs or more), this
builds the grid of all of them at once with
:func:`~reshard.planner.cells.decompose.decompose_table`'s arrays and labels each cell
by its holders, needers and step.

Why the cells are the same: the holder boxes are disjoint, so a held cell of the joint
grid lies in pieces of one step only, and its holders are that step's. The joint grid
refines each step's own (it has every step's cut points), and merging equal
neighbours (:func:`~reshard.planner.cells.decompose.merge_cells`) of a refined grid
gives the coarse grid's merged cells: so where no two cells share holders, needers and
step, no step's grid merges either, and its cells are the joint grid's held cells of
that step. Row-major order of a grid is box order, the order the per-step cells are
sorted in. Where two cells share a label (a merge might happen), :func:`stepped_table`
returns None and the caller decomposes step by step.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from reshard.layout import Box
from reshard.planner.cells.decompose import (
    TABLE_FROM,
    CellTable,
    _grid,
    _PieceSets,
    _repeats,
    _volumes,
    pieces,
)


def stepped_table(shape: tuple[int, ...], holders: Mapping[Box, frozenset[int]],
                  needers: Mapping[Box, frozenset[int]], ready: Mapping[Box, int]
                  ) -> tuple[CellTable, np.ndarray] | None:
    """The held cells of every step's pieces (``ready``'s step of each holder box, 0
    where it has none), in box order, as the table
    :meth:`~reshard.planner.cells.decompose.CellTable.from_cells` makes of them (sets
    numbered as they first appear), and each cell's step; None where the grid is
    small (below :data:`~reshard.planner.cells.decompose.TABLE_FROM` pairs), two
    cells share holders, needers and step (they might merge) or a cell lies in two
    holder boxes."""
    ndim = len(shape)
    if len(holders) * len(needers) < TABLE_FROM or not ndim or any(s == 0 for s in shape):
        return None
    src, dst = pieces(holders), pieces(needers)
    if not src or not dst:
        return None
    src_sets = _PieceSets([devs for _, devs in src])
    dst_sets = _PieceSets([devs for _, devs in dst])
    lo, hi, cell_src, cell_dst = _grid(shape, src, dst, src_sets, dst_sets)
    held = np.flatnonzero(cell_src != src_sets.nothing)
    lo, hi, cell_src, cell_dst = lo[held], hi[held], cell_src[held], cell_dst[held]
    sets = src_sets.sets
    if any(len(sets[i]) > 1 for i in np.unique(cell_src).tolist()):
        return None  # holder boxes that overlap: not one step a cell
    piece_step = [ready.get(box, 0) for box, _ in src]
    set_step = np.array([piece_step[min(s)] if s else 0 for s in sets], dtype=np.int64)
    hold_of = np.array(src_sets.device_set, dtype=np.int64)[cell_src]
    need_of = np.array(dst_sets.device_set, dtype=np.int64)[cell_dst]
    steps = set_step[cell_src]
    n_hold, n_need = len(src_sets.distinct_devices()), len(dst_sets.distinct_devices())
    codes, n_codes = _codes((steps, hold_of, need_of), (int(steps.max()) + 1 if len(steps)
                                                        else 1, n_hold, n_need))
    if _repeats(codes, n_codes):
        return None
    holder, holder_sets = _first_seen(hold_of, src_sets.distinct_devices())
    needer, needer_sets = _first_seen(need_of, dst_sets.distinct_devices())
    table = CellTable(lo, hi, _volumes(hi - lo), holder, needer, holder_sets, needer_sets)
    return table, steps


def _codes(columns: tuple[np.ndarray, ...], spans: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """One non-negative code per row for the tuple of ``columns`` (each below its
    span), and the span of the codes."""
    code = np.zeros(len(columns[0]), dtype=np.int64)
    span = 1
    for col, n in zip(columns, spans):
        code = code * n + col
        span *= n
    return code, span


def _first_seen(ids: np.ndarray, sets: tuple[frozenset[int], ...]
                ) -> tuple[np.ndarray, tuple[frozenset[int], ...]]:
    """``ids`` renumbered in order of first appearance, and the sets they name in that
    order (as :meth:`~reshard.planner.cells.decompose.CellTable.from_cells` numbers a
    column's sets)."""
    uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[order] = np.arange(len(uniq), dtype=np.int64)
    named = uniq[order].tolist()
    return rank[inverse.reshape(-1)], tuple(sets[i] for i in named)


__all__ = ["stepped_table"]

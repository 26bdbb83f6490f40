"""A work list's point-to-point rows (one holder, one needer on another device), kept
as columns: added table by table (:class:`PointToPoint`), read column by column
(:class:`PointColumns`) by :mod:`reshard.planner.schedule.work`, which charges them in
bulk, and by :mod:`reshard.planner.schedule.send_order`, which places them in the
global order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reshard.layout import Box
from reshard.planner.cells.decompose import CellTable


@dataclass(frozen=True, eq=False)
class PointColumns:
    """Point-to-point rows, column by column (see :class:`PointToPoint`)."""

    tensor: np.ndarray
    root: np.ndarray
    recv: np.ndarray
    nbytes: np.ndarray
    box: np.ndarray  # (rows, 2 * ndim): starts and stops, zero-padded to the widest
    # (laid out column by column where :meth:`PointToPoint.columns` makes it)
    ndim: np.ndarray

    def box_of(self, row: int) -> Box:
        """Row ``row``'s box as a tuple of (start, stop)."""
        flat = self.box[row, :2 * int(self.ndim[row])].tolist()
        return tuple(zip(flat[0::2], flat[1::2]))


SAME_FROM = 4096
"""Rows from which a column of one value is that value broadcast (:func:`_repeated`;
below, writing it costs less than the view)."""


class PointToPoint:
    """The point-to-point rows of a work list, added table by table."""

    def __init__(self) -> None:
        self._parts: list[tuple[int, CellTable, np.ndarray, np.ndarray, np.ndarray,
                                np.ndarray]] = []
        self.count = 0

    def add(self, tensor: int, table: CellTable, rows: np.ndarray, root: np.ndarray,
            recv: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Add ``rows`` of ``table`` (their holders, needers and bytes); return their
        indices among all rows added."""
        self._parts.append((tensor, table, rows, root, recv, nbytes))
        self.count += len(rows)
        return np.arange(self.count - len(rows), self.count, dtype=np.int64)

    def columns(self) -> PointColumns:
        """Every row added, column by column (a column of one value for every row, of
        at least :data:`SAME_FROM` rows: that value broadcast, read only; the box's
        columns each contiguous)."""
        parts = self._parts
        ndims = [p[1].lo.shape[1] for p in parts]
        width = 2 * max(ndims, default=0)
        padded = any(2 * nd < width for nd in ndims)  # padding stays zero
        box = _box(self.count, width, padded)
        at = 0
        for (_, table, rows, _, _, _), nd in zip(parts, ndims):
            box[at:at + len(rows), 0:2 * nd:2] = _rows_of(table.lo, rows)
            box[at:at + len(rows), 1:2 * nd:2] = _rows_of(table.hi, rows)
            at += len(rows)
        sizes = [len(p[2]) for p in parts]
        return PointColumns(_repeated([p[0] for p in parts], sizes),
                            cat([p[3] for p in parts]), cat([p[4] for p in parts]),
                            cat([p[5] for p in parts]), box, _repeated(ndims, sizes))


def _box(rows: int, width: int, padded: bool) -> np.ndarray:
    """An int64 ``(rows, width)`` box to write (zeros where ``padded``): of at least
    :data:`COLUMNS_FROM` rows, laid out column by column (the transpose of a ``(width,
    rows)`` array: the order reads it a key column at a time, each contiguous so; the
    same values), else row by row (numpy's gathers of its rows cost less so)."""
    new = np.zeros if padded else np.empty
    if rows >= COLUMNS_FROM:
        return new((width, rows), dtype=np.int64).T
    return new((rows, width), dtype=np.int64)


COLUMNS_FROM = 4096
"""Rows from which :func:`_box` lays the box out column by column (where
:func:`~reshard.planner.schedule.packed_sort.lexsort` packs the order's keys a column at
a time)."""


def _repeated(values: list[int], sizes: list[int]) -> np.ndarray:
    """``values[i]`` ``sizes[i]`` times each, one after another: where every part's
    value is one and the rows are many (:data:`SAME_FROM`), that value broadcast (read
    only, no array of its rows written)."""
    total = sum(sizes)
    if total >= SAME_FROM and len(set(values)) == 1:
        return np.broadcast_to(np.int64(values[0]), (total,))
    return cat([np.full(n, v, dtype=np.int64) for v, n in zip(values, sizes)])


def _rows_of(corners: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``corners[rows]`` for ascending distinct ``rows``: ``corners`` itself where they
    are every row, else gathered row by row (:func:`numpy.take`, the same values)."""
    if len(rows) == len(corners):
        return corners
    return np.take(corners, rows, axis=0)


def cat(parts: list[np.ndarray]) -> np.ndarray:
    """``parts`` one after another (none: an empty int64 array; one: that array itself,
    not copied: the columns are only read)."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

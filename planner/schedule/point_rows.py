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
    ndim: np.ndarray

    def box_of(self, row: int) -> Box:
        """Row ``row``'s box as a tuple of (start, stop)."""
        flat = self.box[row, :2 * int(self.ndim[row])].tolist()
        return tuple(zip(flat[0::2], flat[1::2]))


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
        """Every row added, column by column."""
        parts = self._parts
        width = 2 * max((p[1].lo.shape[1] for p in parts), default=0)
        box = np.zeros((self.count, width), dtype=np.int64)
        at = 0
        for _, table, rows, _, _, _ in parts:
            nd = table.lo.shape[1]
            box[at:at + len(rows), 0:2 * nd:2] = _rows_of(table.lo, rows)
            box[at:at + len(rows), 1:2 * nd:2] = _rows_of(table.hi, rows)
            at += len(rows)
        return PointColumns(cat([np.full(len(p[2]), p[0], dtype=np.int64) for p in parts]),
                            cat([p[3] for p in parts]), cat([p[4] for p in parts]),
                            cat([p[5] for p in parts]), box,
                            cat([np.full(len(p[2]), p[1].lo.shape[1], dtype=np.int64)
                                 for p in parts]))


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

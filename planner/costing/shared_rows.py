"""Rows of integers kept as bytes, each equal to one kept before as that very object
(issue 62, round eighteen): the form rows of a call's thousands of large tasks
(:class:`~reshard.planner.costing.relabel_many.RankedRows`) have a few dozen forms, so
keeping every row's bytes (16 KB a row of 2,000 devices) would keep each form's row
thousands of times over, and turning each into bytes to look it up would write them all
once more, into fresh memory.

:meth:`SharedRows.add` takes a block of rows: each row's weighted sum of a sample (every
:data:`ROW_STRIDE`-th place) names the row kept first with that sum, and the block is
compared with those rows as one array (written into a spare array the caller lends);
a row equal to its row is that row's bytes object. Only a row with no such row, or
one that differs from it (a sum met by another row), is turned into bytes, and found
among the rows of its sum by their bytes, or kept. The same bytes as each row's own."""

from __future__ import annotations

import numpy as np

ROW_STRIDE = 8
"""Places between those of a row's sample, whose weighted sum finds an equal row kept
before (:class:`SharedRows`): an eighth of the row's work."""


class SharedRows:
    """Rows of ``width`` integers added block by block (:meth:`add`): :attr:`rows`,
    each row's bytes in order, equal rows one object."""

    def __init__(self, width: int) -> None:
        self.rows: list[bytes] = []  # every row added, as bytes
        self.kept: list[bytes] = []  # the distinct rows
        self.table = np.empty((0, width), dtype=np.int64)  # kept rows (the first ones)
        self.by_sum: dict[int, list[int]] = {}  # places in kept, by sampled sum
        self.weights = np.arange(1, len(range(0, width, ROW_STRIDE)) + 1, dtype=np.int64)

    def add(self, block: np.ndarray, spare: np.ndarray) -> None:
        """Add the rows of ``block`` (``spare``: an array of its shape, written
        over)."""
        sums = block[:, ::ROW_STRIDE].dot(self.weights).tolist()
        rows: list[bytes | None] = [None] * len(sums)
        if self.kept:
            firsts = [-1 if got is None else got[0] for got in map(self.by_sum.get, sums)]
            at = np.array(firsts, dtype=np.int64)
            # each row's first kept row of its sum (row 0 for none: not read below)
            ref = self.table.take(np.maximum(at, 0), axis=0, out=spare, mode="clip")
            kept = self.kept
            for k in np.flatnonzero((block == ref).all(axis=1) & (at >= 0)).tolist():
                rows[k] = kept[firsts[k]]
        for k in [k for k, row in enumerate(rows) if row is None]:
            rows[k] = self._found(sums[k], block[k])
        self.rows += rows  # type: ignore[arg-type]  # every row found

    def _found(self, total: int, row: np.ndarray) -> bytes:
        """The kept bytes equal to ``row`` (its sampled sum ``total``), kept where none
        is."""
        data = row.tobytes()
        places = self.by_sum.setdefault(total, [])
        for i in places:
            if self.kept[i] == data:
                return self.kept[i]
        n = len(self.kept)
        if n == len(self.table):  # full: twice the room
            table = np.empty((max(8, 2 * n), self.table.shape[1]), dtype=np.int64)
            table[:n] = self.table
            self.table = table
        self.table[n] = row
        self.kept.append(data)
        places.append(n)
        return data


__all__ = ["ROW_STRIDE", "SharedRows"]

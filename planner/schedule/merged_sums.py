"""A floor's bytes of one resource kind summed as whole integers: additions that repeat
the same arrays merged into one, exact where every byte count is a whole number.

A floor (:mod:`reshard.planner.schedule.floors`) sums, per resource kind, the bytes of
each (index, step) from 0.0 in the order they are added. A run of like cells adds the
same receivers' arrays once a cell: a thousand cells, a million rows. Where every value
added is a whole number and the kind's bytes together (their magnitudes) stay below
2**53, every partial sum of any order of those additions is a whole number below
2**53, so a float64 holds each one exactly: the sums are the exact sums, whatever the
order, and a product ``count * bytes`` is the ``count`` additions of ``bytes``. Then an
array pair (indices, steps) added again is merged into its first addition (its values
summed there), and a key sent ``n`` equal rows gets one row of ``n`` times the bytes:
the same keys, first added in the same order (a repeat adds no new key), and the same
sums. Where that does not hold (:meth:`MergedKind.exact_chunks` finds a value not whole
or the bytes too many), the caller counts the kind again one addition at a time
(:class:`Inexact`).
"""

from __future__ import annotations

import numpy as np

from reshard.planner.cells.whole_sums import EXACT


class Inexact(Exception):
    """Some kind's merged additions may not sum to the one-by-one sums: count again."""


def whole(values: np.ndarray) -> bool:
    """Whether every value is a whole number (finite)."""
    return bool(np.all(np.isfinite(values)) and np.all(np.floor(values) == values))


class MergedKind:
    """Bytes by (index, step) for one kind of resource, each array pair (the same
    index and step array objects) added to once and its later additions' values kept
    beside it, rows one by one kept in order between them (as
    :class:`~reshard.planner.schedule.floors` ``_Kind`` keeps them)."""

    def __init__(self) -> None:
        # per chunk in the order first added: index, step, and its values, each values
        # array with how many times it was added
        self.chunks: list[tuple[np.ndarray, np.ndarray, dict[int, tuple[np.ndarray, int]]]] = []
        self._slot: dict[tuple[int, int], dict[int, tuple[np.ndarray, int]]] = {}
        self.rows: list[tuple[int, int, float]] = []
        self.one = self.rows.append  # add one (index, step, bytes)

    def add(self, index: np.ndarray, step: np.ndarray, nbytes: np.ndarray) -> None:
        """Add ``nbytes[i]`` to ``(index[i], step[i])``; ``index`` and ``step`` are read
        only as long as this kind lives (an array pair added again is merged: it adds
        no key, so the rows one by one around it stay one chunk)."""
        key = (id(index), id(step))
        values = self._slot.get(key)
        if values is None:
            self._flush()
            values = self._slot[key] = {}
            self.chunks.append((index, step, values))
        got = values.get(id(nbytes))
        values[id(nbytes)] = (nbytes, 1 if got is None else got[1] + 1)

    def _flush(self) -> None:
        if self.rows:
            index, step, nbytes = zip(*self.rows)
            one = np.array(nbytes, dtype=np.float64)
            self.chunks.append((np.array(index, dtype=np.int64),
                                np.array(step, dtype=np.int64), {id(one): (one, 1)}))
            self.rows.clear()

    def exact_chunks(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Each chunk's (index, step, bytes), its values' additions summed as products
        (module docstring); raises :class:`Inexact` where those sums may not be the
        one-by-one sums."""
        self._flush()
        out = []
        total = 0.0
        for index, step, values in self.chunks:
            summed = np.zeros(len(index))
            for nbytes, count in values.values():
                if not whole(nbytes):
                    raise Inexact
                total += float(np.abs(nbytes).sum()) * count
                summed += nbytes * count
            out.append((index, step, summed))
        if not total < EXACT:
            raise Inexact
        return out


__all__ = ["Inexact", "MergedKind", "whole"]

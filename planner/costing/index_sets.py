"""Sets of indices as arrays: ranges laid end to end, distinct values, and a
filling's edges on the resources that fill (:class:`~reshard.planner.costing.fairshare.
FairShare`'s progressive filling reads them)."""

from __future__ import annotations

import numpy as np


def ranges(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(starts[i], stops[i])`` over ``i``."""
    if len(starts) == 1:
        return np.arange(int(starts[0]), int(stops[0]), dtype=np.int64)
    lens = stops - starts
    ends = lens.cumsum()
    total = int(ends[-1]) if len(ends) else 0
    if not total:
        return np.zeros(0, dtype=np.int64)
    out: np.ndarray = (starts - ends + lens).repeat(lens) + np.arange(total)
    return out


def is_arange(values: np.ndarray, n: int) -> bool:
    """Whether ``values`` (integers) is ``np.arange(n)``: ``n`` of them, rising one
    by one from 0 (``n`` strictly increasing integers from 0 to ``n - 1`` are every
    one of them, in order), without an ``arange`` laid out to compare with."""
    if len(values) != n:
        return False
    return not n or bool(values[0] == 0 and values[-1] == n - 1 and
                         (values[1:] > values[:-1]).all())


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of integers: a sort, then the first of each run of equal
    values (the same array; numpy 2.4's ``np.unique`` hashes, 10-70 times slower on
    large arrays)."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def distinct(values: np.ndarray, bound: int) -> np.ndarray:
    """``np.unique(values)`` for integers in ``[0, bound)``: a flag per value where the
    range is not far larger than the values (:func:`flagged_distinct`), else
    :func:`sorted_distinct`."""
    if bound > 4 * len(values) + 4096:
        return sorted_distinct(values)
    return flagged_distinct(values, bound)


def flagged_distinct(values: np.ndarray, bound: int) -> np.ndarray:
    """``np.unique(values)`` for integers in ``[0, bound)`` (a flag per value: linear,
    where the sort is not)."""
    seen = np.zeros(bound, dtype=bool)
    seen[values] = True
    return seen.nonzero()[0]


class EdgesOn:
    """A filling's edges ``mine`` (``res``: their resources, of ``nres``) on the
    resources that fill in a round: found by one pass over every edge (:meth:`swept`:
    the first round, so that a filling that freezes everything there never sorts), or
    from the edges sorted by resource (:meth:`sorted`: sorted once, each resource's
    read when it fills). The two differ in order only, which no reader of them sees
    (the transfers they cross are taken as a set). ``mine`` None: every edge (edge
    ``i`` is ``i``: no ``arange`` of them all laid out)."""

    def __init__(self, mine: np.ndarray | None, res: np.ndarray, nres: int) -> None:
        self.mine, self.res, self.nres = mine, res, nres
        self.by_res: np.ndarray | None = None
        self.res_at = np.zeros(0, dtype=np.int64)

    def swept(self, tight: np.ndarray) -> np.ndarray:
        """The edges on the resources ``tight``, in edge order."""
        flag = np.zeros(self.nres, dtype=bool)
        flag[tight] = True
        on = flag[self.res]
        edges: np.ndarray = on.nonzero()[0] if self.mine is None else self.mine[on]
        return edges

    def sorted(self, tight: np.ndarray) -> np.ndarray:
        """The edges on the resources ``tight``, resource by resource."""
        if self.by_res is None:
            r = self.res
            order = np.argsort(r.astype(np.int16) if self.nres < 1 << 15 else r,  # radix
                               kind="stable")
            self.by_res = order if self.mine is None else self.mine[order]
            self.res_at = np.searchsorted(r[order], np.arange(self.nres + 1))
        edges: np.ndarray = self.by_res[ranges(self.res_at[tight], self.res_at[tight + 1])]
        return edges


__all__ = ["EdgesOn", "distinct", "flagged_distinct", "is_arange", "ranges", "sorted_distinct"]

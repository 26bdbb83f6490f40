"""PointToPoint.columns (planner/schedule/point_rows.py) against the columns written
row by row: a tensor's or an ndim's column of one value over many rows broadcast, the
box written without zeroing where no part is padded; the same values, dtypes and
shapes, for one part or several, of one or several tensors and ndims, every row or
some."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.planner.cells.decompose import CellTable
from reshard.planner.schedule import point_rows
from reshard.planner.schedule.point_rows import PointToPoint


def _table(rng, n, ndim):
    lo = rng.integers(0, 1000, (n, ndim))
    hi = lo + rng.integers(1, 9, (n, ndim))
    return CellTable(lo, hi, np.prod(hi - lo, axis=1), np.zeros(n, np.int64),
                     np.zeros(n, np.int64), (frozenset({0}),), (frozenset({1}),))


def _written(parts, count):
    """The columns as the rows give them, one by one."""
    width = 2 * max((t.lo.shape[1] for _, t, *_ in parts), default=0)
    tensor, ndim, box = [], [], np.zeros((count, width), np.int64)
    at = 0
    for k, table, rows, *_ in parts:
        for r in rows.tolist():
            nd = table.lo.shape[1]
            tensor.append(k)
            ndim.append(nd)
            for d in range(nd):
                box[at, 2 * d], box[at, 2 * d + 1] = table.lo[r, d], table.hi[r, d]
            at += 1
    return np.array(tensor, np.int64), np.array(ndim, np.int64), box


CASES = {  # each part: (tensor, rows, ndim, every row or some)
    "one small": [(0, 40, 2, True)],
    "one large": [(0, 5000, 2, True)],
    "one large, some rows": [(3, 9000, 3, False)],
    "two tensors": [(0, 3000, 2, True), (1, 3000, 2, False)],
    "one tensor, two parts": [(2, 3000, 2, True), (2, 2500, 2, False)],
    "ndims padded": [(0, 4000, 1, True), (0, 4000, 3, True)],
    "ndims padded, small": [(0, 5, 3, True), (1, 7, 1, False)],
    "none": [],
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", range(3))
def test_columns_are_the_rows_written_one_by_one(case, seed):
    rng = np.random.default_rng(seed)
    p2p = PointToPoint()
    for tensor, n, ndim, every in CASES[case]:
        table = _table(rng, n, ndim)
        rows = np.arange(n) if every else np.flatnonzero(rng.random(n) < 0.6)
        root, recv = rng.integers(0, 64, len(rows)), rng.integers(0, 64, len(rows))
        p2p.add(tensor, table, rows, root, recv, rng.integers(1, 99, len(rows)))
    got = p2p.columns()
    tensor, ndim, box = _written(p2p._parts, p2p.count)
    for name, want in (("tensor", tensor), ("ndim", ndim), ("box", box)):
        have = getattr(got, name)
        assert have.dtype == np.int64 and have.shape == want.shape, name
        assert np.array_equal(have, want), name
    many = p2p.count >= point_rows.SAME_FROM
    assert got.tensor.flags.writeable is not (many and len(set(tensor.tolist())) == 1)
    assert got.ndim.flags.writeable is not (many and len(set(ndim.tolist())) == 1)
    for r in range(0, p2p.count, 997):  # a row's box as the cell planner builds it
        assert got.box_of(r) == tuple(
            (int(box[r, 2 * d]), int(box[r, 2 * d + 1])) for d in range(int(ndim[r])))

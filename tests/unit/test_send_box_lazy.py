"""SendColumns' boxes gathered on first read (issue 62, round eighteen): ``in_order``
keeps the point-to-point rows' boxes and each send's row of them; ``box`` (the
digest's) gathers them on first read, ``boxes`` (the tasks') reads the rows it
builds from the source. Both against the boxes indexed as before, on sends-only and
mixed orders, with rows left out and uneven dims; an estimate never gathers."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.planner.schedule import send_order
from tests.unit.test_send_order import CLUSTER, HOST, _columns, _objects, _reference


@pytest.mark.parametrize("seed", range(8))
def test_box_and_boxes_are_the_rows_indexed(seed):
    rng = np.random.default_rng(100 + seed)
    n = 4200 + 53 * seed
    p2p = _columns(rng, n, ties=seed % 2 == 1)
    objects = _objects(rng, 0 if seed < 4 else 25)
    seq = rng.permutation(n + len(objects)).astype(np.int64)
    obj_seq, p_seq = seq[:len(objects)], seq[len(objects):].copy()
    if seed % 4 >= 2:
        p_seq[rng.integers(0, n, n // 4)] = -1
    p_step = rng.integers(0, 3, n)
    got = send_order.in_order(objects, obj_seq, p2p, p_seq, p_step, HOST, CLUSTER)
    cols = got.send_columns
    want_box, want_ndim = _reference(objects, obj_seq, p2p, p_seq, p_step)[2][6:]
    assert "box" not in cols.__dict__  # not gathered yet
    rows = rng.permutation(len(cols.position))[:300]
    want = [tuple((int(a), int(b)) for a, b in zip(want_box[r, 0:2 * k:2], want_box[r, 1:2 * k:2]))
            for r, k in zip(rows.tolist(), want_ndim[rows].tolist())]
    assert cols.boxes(rows) == want
    assert "box" not in cols.__dict__  # the tasks' boxes read the source
    assert cols.box.dtype == want_box.dtype and np.array_equal(cols.box, want_box)
    assert cols.box is cols.box  # gathered once


def test_an_estimate_never_gathers_the_boxes(monkeypatch):
    """A large plan's estimate reads no send's box: the gather would raise."""
    from reshard.planner.estimates import CostCache, estimate_many
    from reshard.planner.schedule.send_columns import SendColumns
    from tests.unit.test_share import CL, MIX

    def refuse(self):
        raise AssertionError("box gathered")

    want = estimate_many([(*MIX[0], CL)], cache=CostCache())
    monkeypatch.setattr(SendColumns, "box", property(refuse))
    assert estimate_many([(*MIX[0], CL)], cache=CostCache()) == want


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("columns_from", [0, 10 ** 9])
def test_point_rows_box_is_laid_out_column_by_column(seed, columns_from, monkeypatch):
    """The point-to-point box's columns each contiguous (the order's keys) from
    ``COLUMNS_FROM`` rows (else its rows), its values the rows' boxes either way, zero
    past each row's dims (tables of 1 to 3 dims, some rows)."""
    from reshard.planner.schedule import point_rows
    from reshard.planner.schedule.point_rows import PointToPoint
    from tests.unit.test_point_columns import _table

    monkeypatch.setattr(point_rows, "COLUMNS_FROM", columns_from)
    rng = np.random.default_rng(seed)
    p2p, want = PointToPoint(), []
    for nd in rng.integers(1, 4, 3).tolist():
        table = _table(rng, 50, nd)
        rows = np.sort(rng.choice(50, 30 if seed % 2 else 50, replace=False))
        p2p.add(0, table, rows, rows, rows + 1, rows * 8)
        for r in rows.tolist():
            want.append([v for j in range(nd) for v in (table.lo[r, j], table.hi[r, j])])
    box = p2p.columns().box
    if columns_from == 0:
        assert all(box[:, j].flags.c_contiguous for j in range(box.shape[1]))
    else:
        assert box.flags.c_contiguous
    assert box.tolist() == [w + [0] * (box.shape[1] - len(w)) for w in want]

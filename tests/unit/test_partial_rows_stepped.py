"""A partial source's cells as a CellTable below the numpy grid's threshold and across
reduced pieces of several steps (reduce._as_rows: half or more of the cells point to
point, so the work list keeps those as send columns): the same cells and steps as the
cell list, and the same cold estimates and plans as with the list kept (issue 62,
round fourteen)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.cells import reduce
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.decompose import Cell, CellTable, devices_by_box
from reshard.planner.cuts import balance_piece
from reshard.planner.plan import make_tensor_spec
from reshard.planner.schedule import work
from tests.unit.test_partial_table_rows import _answers  # estimates and both digests

CLUSTERS = {"dgx": Cluster.preset("dgx-h100", 8),
            "regular": Cluster.regular(8, 8, nic_bandwidth=1e9, intra_bandwidth=4e9,
                                       latency=2e-5),
            "odd hosts": Cluster.from_hosts([range(5), range(5, 19), range(19, 64)])}
MOVES = [("RR+P0", "RS10"), ("RR+P01", "RS01"), ("S0R+P1", "RS10"), ("RS1+P0", "S0S1"),
         ("RR+P1", "S0S1"), ("RR+P0", "RS0"), ("S1R+P0", "RR"), ("RS0+P1", "S10R")]
SHAPES = [(2048, 2048), (16384, 4096), (1000, 777)]


def _layouts(src, dst, overlap):
    """Two 4x8 layouts, on distinct meshes or (``overlap``) sharing half their devices."""
    a = DeviceMesh((4, 8), range(32))
    b = DeviceMesh((4, 8), range(16, 48) if overlap else range(32, 64))
    return Layout(a, src), Layout(b, dst)


def _pieces(cluster, shape, src, dst, overlap, fine):
    """What cuts.cut_cells hands decompose_pieces for one partial tensor."""
    a, b = _layouts(src, dst, overlap)
    t = make_tensor_spec(shape, "bfloat16", a, b, cluster)
    needers = devices_by_box(t.dst, t.shape)
    holders, reduces = reduce.reduce_sources(t, 0, Loads(cluster), needers,
                                             balance_piece(cluster, fine))
    return t.shape, holders, needers, {r.box: r.step + 1 for r in reduces}


def _as_list(cells, steps):
    if isinstance(cells, CellTable):
        return cells.cells(), np.asarray(steps).tolist()
    return list(cells), list(steps)


@pytest.mark.parametrize("fine", [False, True])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_the_rows_are_the_cells_and_steps(name, shape, overlap, fine):
    cluster = CLUSTERS[name]
    tables = steps_seen = 0
    for src, dst in MOVES:
        args = _pieces(cluster, shape, src, dst, overlap, fine)
        got = reduce.decompose_pieces(*args, table=True)
        want = reduce.decompose_pieces(*args, table=False)
        assert isinstance(want[0], list)
        assert _as_list(*got) == _as_list(*want)
        if isinstance(got[0], CellTable):
            tables += 1
            assert got[1].dtype == np.int64
            steps_seen += len(set(got[1].tolist())) > 1
    assert tables  # some tables; of large tensors some of several steps' pieces
    assert steps_seen or shape[0] * shape[1] < 1 << 24


def _random_cells(rng, n):
    cells = []
    for k in range(n):
        holders = frozenset(rng.sample(range(6), rng.choice([1, 1, 1, 2])))
        needers = frozenset(rng.sample(range(6), rng.choice([1, 1, 2, 3])))
        if rng.random() < 0.2:  # a needer that holds it already
            needers = holders
        cells.append(Cell(((k, k + 1), (0, rng.choice([1, 3]))), holders, needers))
    return cells


@pytest.mark.parametrize("seed", range(40))
def test_the_count_on_cells_is_the_table_s_rule(seed):
    rng = random.Random(seed)
    cells = _random_cells(rng, rng.choice([1, 2, 5, 40]))
    steps = [rng.randrange(3) for _ in cells]
    got, got_steps = reduce._as_rows(cells, steps, 2)
    table = CellTable.from_cells(cells, 2)
    assert isinstance(got, CellTable) is reduce._mostly_point_to_point(table)
    assert _as_list(got, got_steps) == (cells, steps)
    assert reduce._as_rows([], [], 2) == ([], [])


def _requests(cluster):
    out = []
    for k, ((src, dst), shape) in enumerate(zip(MOVES, SHAPES * 3)):
        a, b = _layouts(src, dst, overlap=k % 2 == 1)
        out.append((shape, "bfloat16", a, b))
    return out


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_plans_and_estimates_are_the_cell_list_s(name, monkeypatch):
    cluster = CLUSTERS[name]
    requests = _requests(cluster)
    taken = []
    real = reduce._as_rows

    def spy(cells, steps, ndim):
        got = real(cells, steps, ndim)
        taken.append(isinstance(got[0], CellTable))
        return got

    monkeypatch.setattr(reduce, "_as_rows", spy)
    got = _answers(requests, cluster)
    assert any(taken)
    monkeypatch.setattr(reduce, "_as_rows", lambda cells, steps, ndim: (cells, steps))
    assert got == _answers(requests, cluster)


def _table_oracle(cells, ndim):
    """CellTable.from_cells as it was: the boxes through np.array, sizes by np.prod."""
    bounds = np.array([c.box for c in cells], dtype=np.int64).reshape(len(cells), ndim, 2)
    lo, hi = bounds[:, :, 0], bounds[:, :, 1]
    hold, need = {}, {}
    holder = [hold.setdefault(c.holders, len(hold)) for c in cells]
    needer = [need.setdefault(c.needers, len(need)) for c in cells]
    return lo, hi, np.prod(hi - lo, axis=1), holder, needer, tuple(hold), tuple(need)


@pytest.mark.parametrize("ndim", [0, 1, 2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_a_table_from_cells_is_the_oracle_s(ndim, seed):
    rng = random.Random(seed * 10 + ndim)
    cells = []
    for _ in range(rng.choice([0, 1, 7, 60])):
        box = []
        for _ in range(ndim):
            lo = rng.randrange(1 << 24)
            box.append((lo, lo + rng.choice([1, 2, 5, 1 << 20])))
        cells.append(Cell(tuple(box), frozenset(rng.sample(range(9), rng.randint(0, 2))),
                          frozenset(rng.sample(range(9), rng.randint(1, 3)))))
    got = CellTable.from_cells(cells, ndim)
    lo, hi, size, holder, needer, hold, need = _table_oracle(cells, ndim)
    assert got.lo.tolist() == lo.tolist() and got.hi.tolist() == hi.tolist()
    assert got.size.tolist() == size.tolist() == [c.size for c in cells]
    assert got.holder.tolist() == holder and got.needer.tolist() == needer
    assert (got.holder_sets, got.needer_sets) == (hold, need)
    assert got.cells() == cells


@pytest.mark.parametrize("seed", range(20))
def test_point_rows_are_the_work_list_s_columns(seed):
    """reduce.point_rows: the rows a work list keeps as columns (work._point_to_point)
    counted, the others as their cells in order."""
    rng = random.Random(seed)
    table = CellTable.from_cells(_random_cells(rng, rng.choice([1, 3, 30])), 2)
    root, _ = work._point_to_point(table)
    count, rest = reduce.point_rows(table)
    assert count == int((root >= 0).sum())
    assert rest == table.cells(np.flatnonzero(root < 0))

"""A reduced partial source's cells of every step built as one numpy grid
(cells.stepped_table, issue 62 round fifteen) against the step-by-step decomposition
it replaces in reduce.decompose_pieces: the same cells, in the same order, with the
same steps, as the same table (columns and sets) or list; and None where cells of one
step might merge or holder boxes overlap."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.cells import reduce, stepped_table
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.decompose import CellTable, decompose, devices_by_box
from reshard.planner.cuts import balance_piece
from reshard.planner.plan import make_tensor_spec

CLUSTERS = {"dgx": Cluster.preset("dgx-h100", 8),
            "regular": Cluster.regular(8, 8, nic_bandwidth=1e9, intra_bandwidth=4e9,
                                       latency=2e-5),
            "odd hosts": Cluster.from_hosts([range(5), range(5, 19), range(19, 64)])}
MOVES = [("RR+P0", "RR"), ("RR+P01", "RR"), ("S1R+P0", "RR"), ("RS1+P0", "S0R"),
         ("RR+P1", "S1R"), ("S0R+P1", "RS1"), ("RS0+P1", "S10R"), ("RR+P0", "RS01")]
SHAPES = [(8192, 8192), (16384, 4096), (1000, 777)]


def _pieces(cluster, shape, src, dst, overlap, fine):
    """What cuts.cut_cells hands decompose_pieces for one partial tensor (4x8 meshes,
    distinct or sharing half their devices)."""
    a = DeviceMesh((4, 8), range(32))
    b = DeviceMesh((4, 8), range(16, 48) if overlap else range(32, 64))
    t = make_tensor_spec(shape, "bfloat16", Layout(a, src), Layout(b, dst), cluster)
    needers = devices_by_box(t.dst, t.shape)
    holders, reduces = reduce.reduce_sources(t, 0, Loads(cluster), needers,
                                             balance_piece(cluster, fine))
    return t.shape, holders, needers, {r.box: r.step + 1 for r in reduces}


def _exact(got):
    """Everything of a decompose_pieces answer: a table's columns (values and dtypes)
    and sets, or a list's cells; the steps' type and values."""
    cells, steps = got
    if isinstance(cells, CellTable):
        cols = [(c.tolist(), c.dtype) for c in (cells.lo, cells.hi, cells.size,
                                                 cells.holder, cells.needer)]
        return ("table", cols, cells.holder_sets, cells.needer_sets,
                type(steps), np.asarray(steps).tolist(), steps.dtype)
    return ("list", [(c.box, c.holders, c.needers, c.size) for c in cells],
            type(steps), list(steps), {type(s) for s in steps})


def _step_by_step(monkeypatch, args, table):
    """decompose_pieces without the joint grid (the path it replaces)."""
    with monkeypatch.context() as m:
        m.setattr(reduce, "stepped_table", lambda *a: None)
        return reduce.decompose_pieces(*args, table=table)


@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_the_joint_grid_is_the_step_by_step_cells(monkeypatch, name, shape, overlap, table):
    cluster = CLUSTERS[name]
    used = 0
    for (src, dst), fine in itertools.product(MOVES, (False, True)):
        args = _pieces(cluster, shape, src, dst, overlap, fine)
        got = reduce.decompose_pieces(*args, table=table)
        assert _exact(got) == _exact(_step_by_step(monkeypatch, args, table))
        used += stepped_table.stepped_table(*args) is not None
    assert used or name == "odd hosts"  # served some tensors of the 4x8-host clusters


def _random_case(rng, ndim, roots):
    """Disjoint holder boxes (a random grid of blocks, each one root and step, some
    left out) and a grid of needer boxes, each a random set of devices."""
    shape = tuple(rng.choice([6, 9, 12]) for _ in range(ndim))

    def cuts(n, k):
        return [0, *sorted(rng.sample(range(1, n), k)), n]

    def boxes(k):
        axes = [list(itertools.pairwise(cuts(n, k))) for n in shape]
        return list(itertools.product(*axes))

    holders = {b: frozenset((rng.choice(roots),)) for b in boxes(rng.choice([2, 3]))
               if rng.random() > 0.2}  # some of the tensor held by no one
    ready = {b: rng.choice([0, 1, 2, 3]) for b in holders}
    needers = {b: frozenset(rng.sample(range(8), rng.choice([1, 1, 2])))
               for b in boxes(rng.choice([1, 2]))}
    return shape, holders, needers, ready


def _oracle(shape, holders, needers, ready):
    """The cells of each step's pieces decomposed apart, sorted by box, as a table."""
    by_step = {}
    for box, devs in holders.items():
        by_step.setdefault(ready.get(box, 0), {})[box] = devs
    stepped = sorted(((c, s) for s, part in by_step.items()
                      for c in decompose(shape, part, needers, held_only=True)),
                     key=lambda cs: cs[0].box)
    return CellTable.from_cells([c for c, _ in stepped], len(shape)), [s for _, s in stepped]


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_random_grids_match_the_oracle_or_step_aside(monkeypatch, ndim):
    monkeypatch.setattr(stepped_table, "TABLE_FROM", 0)
    rng = random.Random(62 + ndim)
    served = declined = 0
    for trial in range(150):
        roots = list(range(40)) if trial % 2 else [0, 1, 2]  # few roots: labels repeat
        shape, holders, needers, ready = _random_case(rng, ndim, roots)
        got = stepped_table.stepped_table(shape, holders, needers, ready)
        want, steps = _oracle(shape, holders, needers, ready)
        if got is None:
            declined += 1
            continue
        served += 1
        table, got_steps = got
        assert _exact((table, got_steps)) == _exact((want, np.array(steps, np.int64)))
    assert served and declined


def test_cells_that_might_merge_step_aside():
    # two neighbouring boxes of one step, one root, needed by one device: one cell
    holders = {((0, 4), (0, 8)): frozenset({1}), ((4, 8), (0, 8)): frozenset({1})}
    needers = {((0, 8), (0, 8)): frozenset({9})}
    ready = dict.fromkeys(holders, 1)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(stepped_table, "TABLE_FROM", 0)
        assert stepped_table.stepped_table((8, 8), holders, needers, ready) is None
        ready[((4, 8), (0, 8))] = 2  # of two steps they never merge: served
        table, steps = stepped_table.stepped_table((8, 8), holders, needers, ready)
        assert len(table) == 2 and steps.tolist() == [1, 2]


def test_overlapping_holder_boxes_step_aside():
    holders = {((0, 6), (0, 8)): frozenset({1}), ((4, 8), (0, 8)): frozenset({2})}
    needers = {((0, 8), (0, 8)): frozenset({9})}
    with pytest.MonkeyPatch.context() as m:
        m.setattr(stepped_table, "TABLE_FROM", 0)
        assert stepped_table.stepped_table((8, 8), holders, needers, {}) is None


def test_small_grids_are_left_to_the_step_by_step_path():
    holders = {((0, 4), (0, 8)): frozenset({1}), ((4, 8), (0, 8)): frozenset({2})}
    needers = {((0, 8), (0, 8)): frozenset({9})}
    assert stepped_table.stepped_table((8, 8), holders, needers, {}) is None

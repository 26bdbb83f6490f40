"""plan_allgathers (planner/cells/cell_tasks.py, the run planner work.py uses for the
``allgather`` strategy) against plan_allgather of each cell in turn: the same tasks
in the same order and the same loads left behind, over runs whose cells repeat their
holders and needers (the memo's key), also as equal sets built in other orders."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.cell_tasks import RUN_PLANNERS, plan_allgather, plan_allgathers
from reshard.planner.cells.decompose import Cell


def _tables(loads):
    return [list(getattr(loads, name).items()) for name in
            ("nic_out", "nic_in", "dev_out", "dev_in")]


def _run(rng, devices):
    # a few holder sets and needer sets, paired every way (a key of one set alone
    # would mix pairs)
    holder_sets = [rng.sample(devices, rng.choice([1, 2, 5, 8, 16])) for _ in range(3)]
    needer_sets = [rng.sample(devices, rng.choice([3, 8, 20, 40])) for _ in range(3)]
    run = []
    for k in range(40):
        holders, needers = rng.choice(holder_sets), rng.choice(needer_sets)
        # equal sets, built in another order (their iteration order may differ)
        holders = frozenset(rng.sample(holders, len(holders)))
        needers = frozenset(rng.sample(needers, len(needers)))
        rows = rng.choice([1, 3, 7, 96])
        box = ((k * 100, k * 100 + rows), (0, rng.choice([5, 64])))
        run.append((Cell(box, holders, needers), k % 3, rng.choice([2, 4]), k // 5))
    return run


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("preset", ["dgx-h100", None])
def test_allgather_run_is_each_cell_in_turn(seed, preset):
    rng = random.Random(seed)
    cluster = Cluster.regular(6, 8, preset=preset) if preset else Cluster.regular(6, 8)
    a, b = Loads(cluster), Loads(cluster)
    run = _run(rng, list(range(48)))
    want = [plan_allgather(cell, tensor, size, a, step) for cell, tensor, size, step in run]
    got = plan_allgathers(run, b)
    assert got == want
    assert _tables(b) == _tables(a)


def test_allgather_has_its_run_planner():
    assert RUN_PLANNERS[plan_allgather] is plan_allgathers

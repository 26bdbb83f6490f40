"""The point-to-point run fast paths (planner/cells/send_runs.py, reached through
broadcast_runs.plan_run and expect_runs.expect_run) against the paths they replace:
each cell by plan_broadcast (Loads.send), each slice by Loads.expect; the same tasks,
the same loads (floats and key order), the same may_relay answers and epochs."""

from __future__ import annotations

import random

import pytest

from reshard.planner.cells import broadcast_runs, cell_tasks, expect_runs, send_runs
from reshard.planner.cells.decompose import Cell
from reshard.planner.schedule.work import _Demand
from reshard.planner.values.resources import NIC_IN
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import assert_same_loads, load_tables, twin_loads

HOSTS, GPUS = 6, 8
N = 600


def _sends(rng, cluster, n, local):
    """``n`` point-to-point cells between a few devices (so keys repeat), ``local``:
    some inside one host."""
    devices = list(cluster.devices)
    few = rng.sample(devices, 12)
    run = []
    for k in range(n):
        a = rng.choice(few)
        if local and rng.random() < 0.3:
            b = rng.choice([d for d in cluster.hosts[cluster.host_of(a)] if d != a])
        else:
            b = rng.choice([d for d in few if cluster.host_of(d) != cluster.host_of(a)])
        box = ((0, rng.choice([0, 1, 3, 64])), (k, k + rng.choice([1, 2])))
        run.append((Cell(box, frozenset({a}), frozenset({b})), k % 3, rng.choice([1, 2]),
                    k % 2))
    return run


def _whole(loads):
    for name in ("nic_out", "nic_in", "dev_out", "dev_in", "expected"):
        table = getattr(loads, name)
        for key in list(table):
            table[key] = float(round(table[key]))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics"])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("crowded", [False, True])
def test_plan_run_of_sends_is_plan_broadcast_in_turn(seed, variant, local, crowded):
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    a, b = twin_loads(rng, cluster, crowded)
    run = _sends(rng, cluster, N, local)
    want = [cell_tasks.plan_broadcast(c, t, i, a, s) for c, t, i, s in run]
    got = broadcast_runs.plan_run(run, b)
    if got is None:  # declined (some end may relay): the caller goes cell by cell
        assert crowded
        got = [cell_tasks.plan_broadcast(c, t, i, b, s) for c, t, i, s in run]
    assert got == want
    assert_same_loads(a, b, expected_order=True)


def test_plan_sends_answers_uncrowded_runs_and_declines_fractions():
    rng = random.Random(5)
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    a, b = twin_loads(rng, cluster, False)
    run = _sends(rng, cluster, N, True)
    assert send_runs.plan_sends(run, b) is not None
    want = [cell_tasks.plan_broadcast(c, t, i, a, s) for c, t, i, s in run]
    assert send_runs.plan_sends(run, b) == want and a.dev_out != b.dev_out  # charged twice
    (root,) = run[0][0].holders
    b.dev_out[root] += 0.5  # a fraction from before: declined, nothing charged
    before = load_tables(b)
    assert send_runs.plan_sends(run, b) is None
    assert load_tables(b) == before
    mixed = [*run[:5], (Cell(((0, 1),), frozenset({1}), frozenset({2, 3})), 0, 2, 0)]
    assert send_runs.plan_sends(mixed, b) is None
    cells = [c for c, _, _, _ in run[:5]]
    assert send_runs.ends(iter(cells)) == ([next(iter(c.holders)) for c in cells],
                                           [next(iter(c.needers)) for c in cells])
    to_itself = Cell(((0, 1),), frozenset({4}), frozenset({4}))
    assert send_runs.ends(iter([*cells, to_itself])) is None
    assert send_runs.ends(iter([*cells, Cell(((0, 1),), frozenset(), frozenset({4}))])) is None


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics"])
@pytest.mark.parametrize("local", [False, True])
def test_expect_run_of_sends_is_loads_expect_in_turn(seed, variant, local):
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    a, b = twin_loads(rng, cluster, True)
    _whole(a)
    _whole(b)
    run = _sends(rng, cluster, N, local)
    cells = [c for c, _, _, _ in run]
    nbytes = [c.size * i for c, _, i, _ in run]
    demand = _Demand(a)
    for cell, nb in zip(cells, nbytes):
        demand.expect(cell.holders, cell.needers, nb)
    a.expected_changed()
    assert expect_runs.expect_run(b, cells, nbytes)
    b.expected_changed()
    assert_same_loads(a, b, expected_order=True)


def test_expect_sends_declines_fractions_and_changes_nothing():
    rng = random.Random(3)
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    loads, _ = twin_loads(rng, cluster, True)
    _whole(loads)
    run = _sends(rng, cluster, N, False)
    cells = [c for c, _, _, _ in run]
    nbytes = [c.size * i for c, _, i, _ in run]
    (b,) = cells[0].needers
    loads.expected[(NIC_IN, loads.nic(b))] += 0.25
    before = (load_tables(loads), loads.shared, loads._epoch)
    assert not send_runs.expect_sends(loads, cells, nbytes)
    assert (load_tables(loads), loads.shared, loads._epoch) == before
    loads.expected[(NIC_IN, loads.nic(b))] -= 0.25
    assert send_runs.expect_sends(loads, cells, nbytes)

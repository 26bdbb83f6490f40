"""The all-gather bulk path's receipts shared by every root (planner/cells/allgather_runs.py,
issue 62 round eighteen: a template's needers' charges found once per needers, extents
and item size) against plan_allgather of each cell in turn: the same tasks in the same
order and the same loads left behind (keys in the same order), over runs where many
roots on several hosts send to the same few needer sets (a partial sum's reduced pieces,
each from its own root), boxes whose pieces are all empty (nothing sent: no key for the
root), and a root on a needer host (a copy: the run is left to each cell, nothing
written)."""

from __future__ import annotations

import random

import pytest

from reshard.planner.cells import allgather_runs, cell_tasks
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.decompose import Cell
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import assert_same_loads, twin_loads

CLUSTERS = regular_clusters(6, 8)


def _shared_needers(rng, cluster, n, empty=False):
    """``n`` cells, each from a root drawn anew from hosts 0-2, to one of three needer
    sets on hosts 3-5 (two or more a host); ``empty``: some boxes of no columns."""
    hosts = cluster.hosts
    sets = [frozenset(d for h in rng.sample([3, 4, 5], rng.randint(1, 3))
                      for d in rng.sample(hosts[h], rng.choice([2, 4, 8])))
            for _ in range(3)]
    roots = [d for h in (0, 1, 2) for d in hosts[h]]
    run = []
    for k in range(n):
        cols = 0 if empty and rng.random() < 0.3 else rng.choice([840, 2520])
        box = ((k * 40, k * 40 + rng.choice([1, 3, 16])), (0, cols))
        run.append((Cell(box, frozenset([rng.choice(roots)]), rng.choice(sets)),
                    k % 2, rng.choice([2, 4]), k // 9))
    return run


def _cell_by_cell(run, loads):
    return [cell_tasks.plan_allgather(c, t, i, loads, s) for c, t, i, s in run]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", sorted(CLUSTERS))
@pytest.mark.parametrize("empty", [False, True])
def test_roots_sharing_needers_are_each_cell_in_turn(seed, name, empty):
    cluster = CLUSTERS[name]
    rng = random.Random(seed)
    run = _shared_needers(rng, cluster, rng.choice([20, 120]), empty)
    assert len({c.holders for c, *_ in run}) > 3  # many roots, few needer sets
    for crowded in (False, True):
        a, b = twin_loads(random.Random(seed), cluster, crowded)
        got = allgather_runs.plan_run(run, a, cell_tasks.split_dim)
        assert got is not None
        assert got == _cell_by_cell(run, b)
        assert_same_loads(a, b, expected_order=True)


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_nothing_sent_leaves_the_roots_keys_unset(name):
    cluster = CLUSTERS[name]
    needers = frozenset(cluster.hosts[3][:4])
    run = [(Cell(((k, k + 1), (0, 0)), frozenset([root]), needers), 0, 2, 0)
           for k, root in enumerate([0, 9, 0, 17])]
    a, b = Loads(cluster), Loads(cluster)  # fresh: a key charged nothing stays unset
    got = allgather_runs.plan_run(run, a, cell_tasks.split_dim)
    assert got == _cell_by_cell(run, b)
    assert_same_loads(a, b, expected_order=True)
    assert not a.dev_out and not a.nic_out


@pytest.mark.parametrize("seed", range(4))
def test_a_root_on_a_needer_host_leaves_the_run_to_each_cell(seed):
    cluster = CLUSTERS["preset"]
    rng = random.Random(seed)
    run = _shared_needers(rng, cluster, 30)
    cell, tensor, itemsize, step = run[17]
    host = next(h for h in cluster.hosts if min(cell.needers) in h)
    mate = min([d for d in host if d not in cell.needers] or cell.needers)  # else a copy
    run[17] = (Cell(cell.box, frozenset([mate]), cell.needers), tensor, itemsize, step)
    a, b = Loads(cluster), Loads(cluster)
    assert allgather_runs.plan_run(run, a, cell_tasks.split_dim) is None
    assert_same_loads(a, b, expected_order=True)  # nothing written
    assert cell_tasks.plan_allgathers(run, a) == _cell_by_cell(run, b)
    assert_same_loads(a, b, expected_order=True)

"""A run of long broadcasts to receivers laid out as whole host rows, planned on rows
(planner/cells/grid_runs.py, issue 62 round thirteen), against each cell planned by
plan_broadcast: the same tasks in the same order and the same loads, keys in the same
order, the same relay questions asked; rows of two, three and eight a host, loads
that tie, tables that start empty or partly filled, crowded clusters (chains that may
relay: the prefix ends there), runs that change receivers, roots or holders midway."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.cluster import Cluster
from reshard.planner.cells import balance, cell_tasks, chain_arrays, grid_runs
from reshard.planner.cells.decompose import Cell
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import assert_same_loads, twin_loads

HOSTS, GPUS = 48, 8
LAYOUTS = {"rows8": (8, 8), "rows3": (3, 24), "rows2": (2, 36)}
"""Receivers a host and receiver hosts (the last ones; the roots on the first)."""


def _receivers(rng, cluster, layout):
    """Whole rows: ``width`` devices (a random pick, ids rising) on each receiver host;
    ``uneven``: one host one fewer (no grid)."""
    width, count = LAYOUTS["rows3" if layout == "uneven" else layout]
    hosts = cluster.hosts[HOSTS - count:]
    picked = [d for h in hosts for d in rng.sample(h, width)]
    if layout == "uneven":
        picked.remove(picked[-1])
    return frozenset(picked)


def _run(rng, cluster, receivers, n, mixed, repeat=False):
    """``n`` one-root cells to ``receivers`` from roots on other hosts (``repeat``: a
    few roots, each root's chain asked again); ``mixed``: a few cells past the middle
    of another kind (a root among the receivers' hosts, two holders, other
    receivers), which end the rows' prefix."""
    away = [d for h in cluster.hosts[:HOSTS - 36] for d in h]
    roots = [rng.choice(away[:4]) for _ in range(n)] if repeat else rng.sample(away, n)
    run = []
    for k in range(n):
        holders, needers = frozenset({roots[k]}), receivers
        if mixed and k > n // 2 and rng.random() < 0.3:
            roll = rng.random()
            if roll < 0.4:
                holders = frozenset({rng.choice(sorted(receivers))})
                needers = receivers - holders
            elif roll < 0.7:
                holders = frozenset(rng.sample(away, 2))
            else:
                needers = frozenset(sorted(receivers)[:70])
        box = ((0, rng.choice([1, 3, 64])), (k, k + rng.choice([1, 2])))
        run.append((Cell(box, holders, needers), k % 3, rng.choice([1, 2]), k % 2))
    return run


def _start(rng, twins, start):
    """The tables to begin with: twin_loads' (every key), none, or some keys only."""
    if start == "preset":
        return
    for loads in twins:
        loads.nic_out.clear()
        loads.nic_in.clear()
    if start == "partial":
        for n in rng.sample(sorted(twins[0].cluster.devices), 150):
            value = float(rng.choice([0, 1, 2]) << 20)
            table = rng.choice(["nic_out", "nic_in", "dev_in"])
            for loads in twins:
                getattr(loads, table)[n] = value


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", ["rows8", "rows3", "rows2", "uneven"])
@pytest.mark.parametrize("crowded", [False, True])
@pytest.mark.parametrize("start", ["preset", "empty", "partial"])
@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("repeat", [False, True])
def test_a_grid_run_is_each_cell_planned_alone(seed, layout, crowded, start, mixed, repeat):
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    a, b = twin_loads(rng, cluster, crowded)
    _start(rng, (a, b), start)
    run = _run(rng, cluster, _receivers(rng, cluster, layout), 48, mixed, repeat)
    want = [cell_tasks.plan_broadcast(c, t, i, a, s) for c, t, i, s in run]
    got = cell_tasks.plan_broadcasts(run, b)
    assert got == want
    assert_same_loads(a, b, expected_order=False)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", ["rows8", "rows3", "rows2"])
@pytest.mark.parametrize("start", ["preset", "empty", "partial"])
def test_the_rows_plan_the_run_where_nothing_relays(seed, layout, start):
    """Not vacuous: on a cluster that nothing crowds, the rows plan every cell (each
    root once)."""
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    a, b = twin_loads(rng, cluster, False)
    _start(rng, (a, b), start)
    run = _run(rng, cluster, _receivers(rng, cluster, layout), 40, False)
    want = [cell_tasks.plan_broadcast(c, t, i, a, s) for c, t, i, s in run]
    got = grid_runs.plan_grid_run(run, b)
    assert len(got) == len(run)
    assert got == want
    assert_same_loads(a, b, expected_order=False)
    assert b.crossings is not None and a.crossings is not None
    assert (b.crossings[0], b.crossings[1:]) == (a.crossings[0], a.crossings[1:])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("layout", ["rows8", "rows3", "rows2"])
def test_a_grid_chain_is_unrelayed_chain(seed, layout):
    """Loads of a few levels (ties everywhere, the moved member's included)."""
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    loads = balance.Loads(cluster)
    receivers = _receivers(rng, cluster, layout)
    for d in receivers:
        loads.nic_out[loads.nic(d)] = float(rng.choice([0, 1, 1, 2]))
        loads.nic_in[loads.nic(d)] = float(rng.choice([0, 1, 2]))
    grid = grid_runs.grid_of(loads, receivers)
    assert grid is not None
    chain = grid_runs.grid_chain(grid)[0]
    assert chain == chain_arrays.unrelayed_chain(loads, 0, sorted(receivers))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_grid_declines_loads_that_are_not_finite(bad):
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    loads = balance.Loads(cluster)
    receivers = _receivers(random.Random(0), cluster, "rows8")
    assert grid_runs.grid_of(loads, receivers) is not None
    loads.nic_in[loads.nic(min(receivers))] = bad
    assert grid_runs.grid_of(loads, receivers) is None


@pytest.mark.parametrize("variant", ["two-nics"])
def test_a_grid_declines_receivers_that_share_a_nic(variant):
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    loads = balance.Loads(cluster)
    assert grid_runs.grid_of(loads, _receivers(random.Random(0), cluster, "rows8")) is None


@pytest.mark.parametrize("layout", ["rows8", "rows2"])
def test_a_root_asked_again_ends_the_rows_where_its_chain_is_looked_up(layout):
    """Rows of 8 on 8 hosts: few enough NICs for ChainMemo to look a root's second
    chain up by the loads (the rows stop before it); rows of 2 on 36 hosts: too many
    (worked out afresh, the rows go on)."""
    rng = random.Random(2)
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    a, b = twin_loads(rng, cluster, False)
    run = _run(rng, cluster, _receivers(rng, cluster, layout), 40, False, repeat=True)
    roots = [next(iter(c.holders)) for c, *_ in run]
    again = next(k for k in range(len(roots)) if roots[k] in roots[:k])
    c = b.copy()
    assert len(grid_runs.plan_grid_run(run, c)) == (again if layout == "rows8" else len(run))
    want = [cell_tasks.plan_broadcast(c, t, i, a, s) for c, t, i, s in run]
    assert cell_tasks.plan_broadcasts(run, b) == want
    assert_same_loads(a, b, expected_order=False)


def test_a_run_of_other_bytes_is_left_to_the_cells():
    """A cell whose bytes are not a whole ``int`` below 2**53 ends the prefix."""
    rng = random.Random(1)
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    a, b = twin_loads(rng, cluster, False)
    run = _run(rng, cluster, _receivers(rng, cluster, "rows8"), 20, False)
    run[12] = (run[12][0], run[12][1], np.int64(2), run[12][3])
    got = grid_runs.plan_grid_run(run, b)
    assert len(got) == 12
    want = [cell_tasks.plan_broadcast(c, t, i, a, s) for c, t, i, s in run[:12]]
    assert got == want
    assert_same_loads(a, b, expected_order=False)


def test_a_grid_declines_hosts_numbered_against_their_devices():
    """Hosts whose order is not their devices' (host 0 holds the last devices): rows
    in id order would break a tie of hosts by the row, not the host; no grid, and
    the run planned cell by cell is the same."""
    hosts = tuple(tuple(range((HOSTS - 1 - h) * GPUS, (HOSTS - h) * GPUS)) for h in range(HOSTS))
    cluster = Cluster(hosts, nics_per_host=GPUS)
    rng = random.Random(3)
    a, b = twin_loads(rng, cluster, False)
    receivers = frozenset(d for h in hosts[:8] for d in h)
    assert grid_runs.grid_of(a, receivers) is None
    roots = rng.sample([d for h in hosts[8:] for d in h], 20)
    run = [(Cell(((0, 2), (k, k + 1)), frozenset({r}), receivers), 0, 2, 0)
           for k, r in enumerate(roots)]
    want = [cell_tasks.plan_broadcast(c, t, i, a, s) for c, t, i, s in run]
    assert cell_tasks.plan_broadcasts(run, b) == want
    assert_same_loads(a, b, expected_order=False)

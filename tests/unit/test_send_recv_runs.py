"""cell_tasks.plan_send_recvs (a run of cells planned point to point with each (holders,
needers) pair's facts found once and the sender's pick and charge inline, issue 62
round seventeen) against plan_send_recv of each cell in turn: the same tasks, and the
same loads (every key in the same order); holders on and off the needers' hosts, needers
that hold the cell (copies), several holders that tie, fractions, empty tables, equal
sets built apart, and cells of many holders (the fallback); and whole 4x8
requests estimated with and without the run planner."""

from __future__ import annotations

import random

import pytest

from reshard.cluster import Cluster
from reshard.layout import DeviceMesh, Layout
from reshard.planner.cells import cell_tasks
from reshard.planner.cells.decompose import Cell
from reshard.planner.cells.holder_arrays import ARRAY_HOLDERS
from reshard.planner.estimates import CostCache, estimate_many
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import assert_same_loads, twin_loads


def _run(rng: random.Random, cluster: Cluster, n: int, fresh: bool):
    """``n`` cells over a few (holders, needers) pairs; ``fresh``: every set a new object."""
    devices = list(cluster.devices)
    hosts = cluster.hosts
    pairs = []
    for _ in range(5):
        holders = rng.sample(devices, rng.choice([1, 1, 2, 3, 4]))
        needers = rng.sample(devices, rng.randint(1, 9))
        if rng.random() < 0.3:  # a needer host that holds it too (a copy, a local sender)
            needers.append(holders[0])
        if rng.random() < 0.3:  # holders together on one host
            holders = rng.sample(hosts[rng.randrange(len(hosts))], 2)
        pairs.append((holders, needers))
    if rng.random() < 0.5:
        pairs.append((rng.sample(devices, min(len(devices), ARRAY_HOLDERS)), devices[:3]))
    run = []
    for k in range(n):
        holders, needers = pairs[0] if k < n // 4 else rng.choice(pairs)
        h, w = (frozenset(list(holders)), frozenset(list(needers))) if fresh else \
            (frozenset(holders), frozenset(needers))
        box = ((k, k + 1), (0, rng.choice([512, 768, 1000])))
        run.append((Cell(box, h, w), rng.randrange(2), rng.choice([2, 4]), rng.randrange(3)))
    return run


def _tables(run):
    """The pairs a run names (memo keys are per set object: reuse them across cells)."""
    seen: dict[tuple[frozenset[int], frozenset[int]], Cell] = {}
    out = []
    for cell, tensor, itemsize, step in run:
        key = (cell.holders, cell.needers)
        first = seen.setdefault(key, cell)
        out.append((Cell(cell.box, first.holders, first.needers), tensor, itemsize, step))
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("start", ["levels", "empty", "fractions"])
@pytest.mark.parametrize("fresh", [False, True])
def test_a_run_is_each_cell_planned_in_turn(seed, start, fresh):
    rng = random.Random(seed)
    clusters = [*regular_clusters(4, 8).values(), Cluster.preset("dgx-h100", 9)]  # 72: many holders
    for cluster in clusters:
        run = _run(rng, cluster, 300, fresh)
        if not fresh:
            run = _tables(run)
        a, b = twin_loads(rng, cluster, crowded=seed % 2 == 1)
        for loads in (a, b):
            if start == "empty":
                loads.nic_out.clear()
                loads.nic_in.clear()
            elif start == "fractions":
                for n in list(loads.nic_out)[::3]:
                    loads.nic_out[n] += 1 / 3
                loads.dev_out[0] += 0.1
        want = [cell_tasks.plan_send_recv(c, t, i, a, s) for c, t, i, s in run]
        got = cell_tasks.plan_send_recvs(run, b)
        assert got == want
        assert_same_loads(a, b, expected_order=True)
        assert sum(len(c.holders) > 1 for c, *_ in run) > 20


def test_send_recv_is_run_by_its_run_planner():
    assert cell_tasks.RUN_PLANNERS[cell_tasks.plan_send_recv] is cell_tasks.plan_send_recvs


def _request(src, dst, shape):
    a = Layout(DeviceMesh((4, 8), range(32)), src)
    b = Layout(DeviceMesh((4, 8), range(32, 64)), dst)
    return (shape, "bfloat16", a, b, Cluster.preset("dgx-h100", 8))


@pytest.mark.parametrize("src,dst,shape", [
    ("S01R", "RS1", (8192, 8192)), ("RS10", "S1R", (2048, 2048)),
    ("RR+P01", "S0R", (2048, 2048)), ("S1S0", "RS1", (2048, 2048))])
def test_requests_estimate_the_same_without_the_run_planner(src, dst, shape, monkeypatch):
    req = _request(src, dst, shape)
    ran = []
    run = cell_tasks.plan_send_recvs

    def counted(cells, loads):
        ran.append(len(cells))
        return run(cells, loads)

    monkeypatch.setitem(cell_tasks.RUN_PLANNERS, cell_tasks.plan_send_recv, counted)
    got = estimate_many([req], cache=CostCache())
    monkeypatch.delitem(cell_tasks.RUN_PLANNERS, cell_tasks.plan_send_recv)
    assert estimate_many([req], cache=CostCache()) == got
    assert sum(ran) > 0

"""A run of all-gather cells with nothing to choose planned in bulk
(planner/cells/allgather_runs.py, issue 62 round ten) against plan_allgather of each
cell in turn: the same tasks in the same order and the same loads left behind (keys
in the same order), over runs of one-holder cells to needers on other hosts (boxes of
a few extents, uneven splits with empty pieces, several needer hosts, item sizes),
on several clusters (aws-p3.8xlarge, shared bandwidth, NICs per GPU or two a host);
where a cell has a choice (several holders, a copy, a local broadcast, a lone needer
on a host) or a sum would not stay whole, nothing is written and the per-cell path
plans it; and whole 4x8 partial-sum requests estimated with and without the bulk
path."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard.cluster import Cluster
from reshard.layout import DeviceMesh, Layout
from reshard.planner.cells import allgather_runs, cell_tasks
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.decompose import Cell
from reshard.planner.estimates import CostCache, estimate_many
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import assert_same_loads, twin_loads


def _clusters() -> dict[str, Cluster]:
    out = dict(regular_clusters(5, 8))
    out["p3"] = Cluster.preset("aws-p3.8xlarge", 4)
    for name in ("dgx-h100", "aws-p3.8xlarge"):
        out[f"shared-{name}"] = dataclasses.replace(Cluster.preset(name, 4),
                                                    shared_bandwidth=5e9)
    return out


CLUSTERS = _clusters()


def _needers(rng, cluster, holder_host):
    """Needers on one to three hosts other than the holder's, two or more each."""
    others = [h for h in range(len(cluster.hosts)) if h != holder_host]
    hosts = rng.sample(others, min(len(others), rng.randint(1, 3)))
    return frozenset(d for h in hosts
                     for d in rng.sample(cluster.hosts[h],
                                         rng.randint(2, len(cluster.hosts[h]))))


def _run(rng, cluster, n, odd=None):
    """``n`` cells of a few (holder, needers) pairs in stretches; ``odd``: one cell
    with a choice (or None)."""
    pairs = []
    for _ in range(3):
        h = rng.randrange(len(cluster.hosts))
        pairs.append((frozenset([rng.choice(cluster.hosts[h])]), _needers(rng, cluster, h)))
    run = []
    for k in range(n):
        holders, needers = pairs[min(k * 3 // n, 2)] if rng.random() < 0.7 else \
            rng.choice(pairs)
        cols = rng.choice([840, 2520])  # whole shares for two to eight needers
        rows = rng.choice([1, 3, 16, 40])
        box = ((k * 50, k * 50 + rows), (0, cols))
        run.append((Cell(box, holders, needers), k % 2, rng.choice([2, 4]), k // 7))
    if odd is not None:
        cell, tensor, itemsize, step = run[n // 2]
        run[n // 2] = (odd(rng, cluster, cell), tensor, itemsize, step)
    return run


def _two_holders(rng, cluster, cell):
    other = rng.choice([d for d in cluster.devices if d not in cell.needers | cell.holders])
    return Cell(cell.box, cell.holders | {other}, cell.needers)


def _a_copy(rng, cluster, cell):
    return Cell(cell.box, cell.holders, cell.needers | cell.holders)


def _local(rng, cluster, cell):
    (holder,) = cell.holders
    mates = [d for host in cluster.hosts if holder in host for d in host if d != holder]
    return Cell(cell.box, cell.holders, cell.needers | set(rng.sample(mates, 2)))


def _lone(rng, cluster, cell):
    (holder,) = cell.holders
    used = {cluster.hosts.index(host) for host in cluster.hosts
            for d in cell.needers | {holder} if d in host}
    free = [h for h in range(len(cluster.hosts)) if h not in used]
    if not free:
        return Cell(cell.box, cell.holders, frozenset(sorted(cell.needers)[:1]))
    return Cell(cell.box, cell.holders, cell.needers | {cluster.hosts[free[0]][0]})


def _odd_share(rng, cluster, cell):
    (a, b), _ = cell.box
    return Cell(((a, b), (0, 7)), cell.holders, cell.needers)  # 7 columns: a fraction


def _cell_by_cell(run, loads):
    return [cell_tasks.plan_allgather(c, t, i, loads, s) for c, t, i, s in run]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_a_run_in_bulk_is_each_cell_in_turn(seed, name):
    cluster = CLUSTERS[name]
    rng = random.Random(seed)
    a, b = twin_loads(rng, cluster, crowded=bool(seed % 2))
    run = _run(rng, cluster, rng.choice([5, 30, 90]))
    got = allgather_runs.plan_run(run, a, cell_tasks.split_dim)
    assert got is not None
    assert got == _cell_by_cell(run, b)
    assert_same_loads(a, b, expected_order=True)
    c, _ = twin_loads(random.Random(seed), cluster, crowded=bool(seed % 2))
    assert cell_tasks.plan_allgathers(run, c) == got
    assert_same_loads(c, a, expected_order=True)


def test_an_uneven_split_with_empty_pieces_is_each_cell_in_turn():
    cluster = CLUSTERS["pieces"]  # a NIC a GPU: an empty piece's NIC is charged nothing
    holders, needers = frozenset([0]), frozenset(range(8, 16))
    run = [(Cell(((k * 10, k * 10 + rows), (0, 5)), holders, needers), 0, 8, 0)
           for k, rows in enumerate([1, 3, 5, 9, 3])]
    a, b = Loads(cluster), Loads(cluster)  # fresh: a key charged nothing stays unset
    got = allgather_runs.plan_run(run, a, cell_tasks.split_dim)
    assert got == _cell_by_cell(run, b)
    assert_same_loads(a, b, expected_order=True)
    assert all(len(tasks) < 9 for tasks in got)  # pieces 6-8 empty: no send, no charge


@pytest.mark.parametrize("odd", [_two_holders, _a_copy, _local, _lone, _odd_share])
@pytest.mark.parametrize("seed", range(3))
def test_a_run_with_a_choice_is_left_to_each_cell(odd, seed):
    cluster = CLUSTERS["preset"]
    rng = random.Random(seed)
    a, b = twin_loads(rng, cluster, crowded=True)
    run = _run(rng, cluster, 20, odd)
    assert allgather_runs.plan_run(run, a, cell_tasks.split_dim) is None
    assert_same_loads(a, b, expected_order=True)  # nothing written
    assert cell_tasks.plan_allgathers(run, a) == _cell_by_cell(run, b)
    assert_same_loads(a, b, expected_order=True)


@pytest.mark.parametrize("start", [0.5, float(2 ** 53 - 1000)])
def test_a_sum_that_would_not_stay_whole_is_left_to_each_cell(start):
    cluster = CLUSTERS["preset"]
    rng = random.Random(4)
    a, b = twin_loads(rng, cluster, crowded=False)
    run = _run(rng, cluster, 10)
    (holder,) = run[0][0].holders
    a.dev_out[holder] = b.dev_out[holder] = start
    assert allgather_runs.plan_run(run, a, cell_tasks.split_dim) is None
    assert_same_loads(a, b, expected_order=True)
    assert cell_tasks.plan_allgathers(run, a) == _cell_by_cell(run, b)
    assert_same_loads(a, b, expected_order=True)


def _request(src, dst, shape):
    a = Layout(DeviceMesh((4, 8), range(32)), src)
    b = Layout(DeviceMesh((4, 8), range(32, 64)), dst)
    return (shape, "bfloat16", a, b, Cluster.preset("dgx-h100", 8))


@pytest.mark.parametrize("src,dst,shape", [
    ("RR+P0", "S0R", (16384, 4096)), ("RS1+P0", "S0R", (4096, 1024)),
    ("RR+P1", "RR", (2048, 2048)), ("RR+P01", "S0R", (1024, 4096)),
    ("S0R+P1", "RS0", (4096, 1024))])
def test_partial_sum_requests_estimate_the_same_without_the_bulk_path(src, dst, shape,
                                                                       monkeypatch):
    req = _request(src, dst, shape)
    taken = []
    plan = allgather_runs.plan_run

    def counted(*args):
        got = plan(*args)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(allgather_runs, "plan_run", counted)
    got = estimate_many([req], cache=CostCache())
    monkeypatch.setattr(allgather_runs, "plan_run", lambda *args: None)
    assert estimate_many([req], cache=CostCache()) == got
    assert sum(taken) > 0

"""Receivers' tuples packed once per call (issue 62, round fifteen): the rows
:class:`relabel_many.RankedRows` ranks with a memo of packed receivers equal those it
ranks without one (and those ranked a row at a time), a tuple whose ``id`` the memo
holds for another tuple is packed anew, and the routes of a call's chains and of its
later plans' trees over the same receivers' tuples (read from the memo, kept with the
call's hops) are the tasks' own, bit for bit."""

from __future__ import annotations

import random
import struct

import pytest

from reshard.planner.costing import cost
from reshard.planner.costing.cost import Hops, Routes, task_path, task_routes
from reshard.planner.costing.fairshare import path_arrays
from reshard.planner.costing.relabel_many import (
    BLOCK,
    RankedRows,
    packed_receivers,
    relabeled_many,
)
from reshard.planner.costing.route_keys import route_key
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit._regular_clusters import regular_clusters
from tests.unit.test_relabel_many import _finder
from tests.unit.test_relabeled_routes import _old_form_row

HOSTS, GPUS = 24, 8


def test_packed_receivers_are_the_packed_bytes():
    pack = struct.Struct("5q").pack
    a = (3, 9, 1, 40, 7)
    b = tuple(int(str(d)) for d in a)  # equal, another tuple
    memo: dict = {}
    read = packed_receivers(pack, memo)
    first = read(a)
    assert first == pack(*a) and read(a) is first  # packed once
    assert read(b) == first and len(memo) == 2  # an equal tuple is its own entry
    assert packed_receivers(pack, None)(a) == pack(*a)
    c = (5, 5, 5, 5, 5)
    memo[id(c)] = (a, pack(*a))  # another tuple held at c's id: not c's bytes
    assert read(c) == pack(*c) and memo[id(c)][0] is c


def _chains_and_trees(rng: random.Random, devices: int, hosts: int, k: int, n: int,
                      base: int = 0) -> tuple[list[Task], list[Task]]:
    """``n`` chains of ``k`` receivers (host by host or not) and a tree over each
    chain's receivers' tuple (the same object), each parent a device before it."""
    chains, trees = [], []
    for _ in range(n):
        picked = [base + d for d in rng.sample(range(hosts * devices), k + 1)]
        if rng.random() < 0.5:
            picked.sort(key=lambda d: (d // devices, rng.random()))
        root, receivers = picked[0], tuple(picked[1:])
        chains.append(Task(TaskKind.BROADCAST, 0, ((0, 8),), root, receivers, 16, 0))
        parents = tuple(rng.choice((root, *receivers[:j])) for j in range(k))
        trees.append(Task(TaskKind.BROADCAST, 0, ((0, 8),), root, receivers, 16, 0,
                          parents=parents))
    return chains, trees


@pytest.mark.parametrize("seed", range(8))
def test_ranked_rows_with_packed_receivers_equal_without(seed):
    rng = random.Random(seed)
    devices = rng.choice([1, 4, 6, 8])
    base = rng.choice([0, 4096])
    chains, trees = _chains_and_trees(rng, devices, 30 + 150 // devices,
                                      rng.randint(2, 70), rng.randint(1, 3 * BLOCK), base)
    memo: dict = {}
    for tasks in (chains, trees, trees):  # the chains' tuples met again, then all known
        rows = RankedRows.of(tasks, devices, memo)
        plain = RankedRows.of(tasks, devices)
        assert rows is not None and plain is not None
        for j, t in enumerate(tasks):
            assert rows.row(j) == plain.row(j) == _old_form_row(t, devices)[0]
            assert rows.number(j).tolist() == plain.number(j).tolist()
        assert rows.order.tolist() == plain.order.tolist()
        assert rows.begin.tolist() == plain.begin.tolist()
    assert len(memo) == len({id(t.receivers) for t in chains})


def test_a_device_below_0_with_packed_receivers():
    tasks = [Task(TaskKind.BROADCAST, 0, ((0, 8),), r, tuple(d for d in range(60) if d != r),
                  16, 0) for r in range(20)]
    memo: dict = {}
    assert RankedRows.of(tasks, GPUS, memo) is not None
    below = [Task(t.kind, 0, ((0, 8),), t.root, t.receivers, 16, 0,
                  parents=(-1,) + (t.root,) * 58) for t in tasks]
    assert RankedRows.of(below, GPUS, memo) is None


@pytest.mark.parametrize("name", list(regular_clusters(HOSTS, GPUS)))
@pytest.mark.parametrize("seed", range(3))
def test_calls_sharing_packed_receivers_find_each_tasks_route(name, seed):
    """relabeled_many over a call's chains, then its trees over the same tuples (some
    twice, other parents), one memo of forms and packed receivers: each route the
    task's own."""
    cluster = regular_clusters(HOSTS, GPUS)[name]
    rng = random.Random(seed)
    chains, trees = _chains_and_trees(rng, GPUS, HOSTS, rng.randint(cost.ARRAY_EDGES, 90),
                                      20)
    again = [Task(t.kind, 0, ((0, 8),), t.root, t.receivers, 16, 0,
                  parents=(t.root,) * len(t.receivers)) for t in trees]
    hops = Hops()
    hops.cluster = cluster
    step = hops.host_step(cluster)
    assert step is not None
    for tasks in (chains, trees, again):
        keys = [route_key(t, 0, 0, False) for t in tasks]
        got = relabeled_many(tasks, keys, step, lambda t: _finder(t, cluster),
                             (hops.forms(), hops.ones()), {}, packed=hops.packed())
        assert got is not None
        for t, (path, lat) in zip(tasks, got):
            want, want_lat = task_path(t, cluster, Hops())
            assert lat == want_lat  # the same float
            assert list(path) == list(want)
    assert len(hops.packed()) == len(chains)


@pytest.mark.parametrize("name", list(regular_clusters(HOSTS, GPUS)))
def test_task_routes_plans_of_one_call_share_packed_receivers(name):
    cluster = regular_clusters(HOSTS, GPUS)[name]
    rng = random.Random(5)
    chains, trees = _chains_and_trees(rng, GPUS, HOSTS, 60, 20)
    known = Routes()
    for tasks in (chains, trees):
        routes = task_routes(tasks, cluster, known)
        for t, (path, lat) in zip(tasks, routes):
            want, want_lat = task_path(t, cluster, Hops())
            assert lat == want_lat
            assert path_arrays(path)[0].tolist() == path_arrays(want)[0].tolist()
    assert known.hops is not None
    assert {id(r) for r, _ in known.hops.packed().values()} == \
        {id(t.receivers) for t in chains}

"""A run of chain broadcasts priced as arrays (issue 62, round nine): each chain's codes
and latency are what :func:`~reshard.planner.costing.cost.task_routes` gives it (the
same integers, the same floats), tasks of other shapes are left to it, and a plan
priced from its columns with the run as arrays has the seconds of the whole plan."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.costing import chain_columns, columns
from reshard.planner.costing.chain_columns import chain_routes
from reshard.planner.costing.cost import Hops, task_routes
from reshard.planner.costing.fairshare import path_arrays
from reshard.planner.costing.stepgate import distinct_devices
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit._chain_clusters import BOX, CLUSTERS


def _random_tasks(rng: random.Random, count: int, devices: int) -> list[Task]:
    """Chain broadcasts of a few receiver counts and byte sizes (some with a device
    twice or off the cluster), trees, fused sums and sends among them."""
    shared = [tuple(rng.sample(range(devices), 4)) for _ in range(6)]
    tasks = []
    for _ in range(count):
        root = rng.randrange(devices)
        pick = rng.random()
        nbytes = rng.choice((8, 4096, 8192, 1 << 20, 3 << 21))
        if pick < 0.4:
            recv = rng.choice(shared)
        elif pick < 0.75:
            recv = tuple(rng.sample(range(devices), rng.choice((3, 4))))
        elif pick < 0.8:
            recv = (root, *rng.sample(range(devices), 3))  # the root again
        elif pick < 0.83:
            recv = (*rng.sample(range(devices), 3), devices + 5)  # off the cluster
        elif pick < 0.9:
            recv = tuple(rng.sample(range(devices), 3))
            tasks.append(Task(TaskKind.BROADCAST, 0, BOX, root, recv, nbytes,
                              parents=(root, root, recv[0])))
            continue
        else:
            tasks.append(Task(TaskKind.SEND, 0, BOX, root, (rng.randrange(devices),), nbytes))
            continue
        tasks.append(Task(TaskKind.BROADCAST, 0, BOX, root, recv, nbytes))
    return tasks


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_chain_routes_are_task_routes(name, monkeypatch):
    cluster = CLUSTERS[name]
    monkeypatch.setattr(chain_columns, "CHAINS_FROM", 4)
    tasks = _random_tasks(random.Random(len(name)), 600, len(cluster.devices))
    got = chain_routes(tasks, cluster, *Hops().arrays(cluster))
    assert got is not None
    index = got.index.tolist()
    assert index == sorted(index)
    chains = {i for i, t in enumerate(tasks) if t.kind is TaskKind.BROADCAST
              and not t.parents and t.root not in t.receivers
              and max(t.receivers) < len(cluster.devices)}
    assert set(index) == chains  # every chain of distinct devices, nothing else
    want = task_routes([tasks[i] for i in index], cluster)
    starts = np.cumsum(got.lens) - got.lens
    for j, (path, lat) in enumerate(want):
        codes, frac = path_arrays(path)
        assert got.codes[starts[j]:starts[j] + got.lens[j]].tolist() == codes.tolist()
        assert (frac == 1.0).all()
        assert got.lat[j] == lat


def test_too_few_chains_are_left_to_task_routes():
    cluster = CLUSTERS["regular"]
    tasks = _random_tasks(random.Random(3), 200, len(cluster.devices))
    assert chain_routes(tasks, cluster, *Hops().arrays(cluster)) is None


@pytest.mark.parametrize("count", [600, 3000])
def test_chain_devices_are_each_tasks_distinct_devices(count, monkeypatch):
    cluster = CLUSTERS["regular"]
    monkeypatch.setattr(chain_columns, "CHAINS_FROM", 4)
    tasks = _random_tasks(random.Random(count), count, len(cluster.devices))
    chains = chain_routes(tasks, cluster, *Hops().arrays(cluster))
    need, member = columns._devices(tasks, chains)
    want_need, want = distinct_devices([t.devices for t in tasks])
    assert need.tolist() == want_need.tolist()
    at = np.cumsum(need) - need
    wat = np.cumsum(want_need) - want_need
    for t in range(len(tasks)):  # the same set, each task's (the step rule reads sets)
        assert sorted(member[at[t]:at[t] + need[t]].tolist()) == \
            sorted(want[wat[t]:wat[t] + want_need[t]].tolist())


@pytest.mark.parametrize("name", sorted(CLUSTERS))
@pytest.mark.parametrize("flaw", [None, "twice", "off"])
def test_kept_routes_are_chain_routes_of_the_tasks(name, flaw, monkeypatch):
    """kept_routes of chains as rows (one length; bytes of several pieces; crossings
    at several places) against chain_routes of the same tasks, field by field; where
    a device is twice or off the cluster, or too few: None (the tasks are priced)."""
    cluster = CLUSTERS[name]
    monkeypatch.setattr(chain_columns, "CHAINS_FROM", 50)
    rng = random.Random(len(name))
    ndev = len(cluster.devices)
    tasks = [Task(TaskKind.BROADCAST, 0, BOX, devs[0], tuple(devs[1:]),
                  rng.choice((8, 4096, 8192, 1 << 20, 3 << 21)))
             for devs in (rng.sample(range(ndev), 5) for _ in range(300))]
    if flaw == "twice":
        tasks[7] = Task(TaskKind.BROADCAST, 0, BOX, 3, (4, 3, 5, 6), 8)
    elif flaw == "off":
        tasks[9] = Task(TaskKind.BROADCAST, 0, BOX, 3, (4, ndev + 2, 5, 6), 8)
    rows = np.array([[t.root, *t.receivers] for t in tasks], dtype=np.int64)
    sizes = np.array([t.nbytes for t in tasks], dtype=np.int64)
    hops = Hops().arrays(cluster)
    got = chain_columns.kept_routes(rows, sizes, cluster, *hops, tasks.__getitem__)
    if flaw is not None:
        assert got is None
        return
    want = chain_routes(tasks, cluster, *hops)
    assert got is not None and want is not None
    for field in ("index", "lens", "codes", "lat", "need", "members"):
        assert np.array_equal(getattr(got, field), getattr(want, field)), field
    assert len(set(got.lat.tolist())) > 1
    assert chain_columns.kept_routes(rows[:49], sizes[:49], cluster, *hops,
                                     tasks.__getitem__) is None  # too few


def test_chain_routes_counts_the_chains_priced_elsewhere(monkeypatch):
    """``also``: chains of a length priced elsewhere count toward CHAINS_FROM (as they
    would were they among the tasks)."""
    cluster = CLUSTERS["regular"]
    monkeypatch.setattr(chain_columns, "CHAINS_FROM", 50)
    rng = random.Random(3)
    tasks = [Task(TaskKind.BROADCAST, 0, BOX, devs[0], tuple(devs[1:]), 4096)
             for devs in (rng.sample(range(len(cluster.devices)), 5) for _ in range(30))]
    hops = Hops().arrays(cluster)
    assert chain_routes(tasks, cluster, *hops) is None
    assert chain_routes(tasks, cluster, *hops, also={3: 40}) is None  # another length
    got = chain_routes(tasks, cluster, *hops, also={4: 20})
    assert got is not None and got.index.tolist() == list(range(30))

"""The routes memo's shared hops (issue 62, round four): routes found through one memo
of routes (``known``) that several plans share, its hops kept beside them, equal the
routes each task finds alone with fresh hops, bit for bit, on shuffled devices, uneven
hosts, several NICs a host, relay pieces and a shared bandwidth; and a memo made on
another cluster lends none of its hops."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard import Cluster
from reshard.planner.costing import cost
from reshard.planner.costing.cost import Hops, Routes, shared_hops, task_path, task_routes
from reshard.planner.values.tasks import Task, TaskKind


def _clusters() -> dict[str, Cluster]:
    rng = random.Random(7)
    shuffled = list(range(40))
    rng.shuffle(shuffled)
    uneven = (tuple(shuffled[:3]), tuple(shuffled[3:11]), tuple(shuffled[11:12]),
              tuple(shuffled[12:25]), tuple(shuffled[25:40]))
    plain = Cluster(uneven, nics_per_host=1)
    return {
        "uneven": plain,
        "nics": dataclasses.replace(plain, nics_per_host=4),
        "pieces": dataclasses.replace(plain, relay_piece=1 << 16),
        "shared": dataclasses.replace(plain, shared_bandwidth=2e10, message_cost=1e-6,
                                      part_cost=2e-7),
        "preset": Cluster.preset("dgx-h100", 5),
    }


def _tasks(rng: random.Random, devices: list[int], n: int) -> list[Task]:
    """Random sends, chains, trees, fused sums and reductions over ``devices``."""
    out = []
    for i in range(n):
        kind = rng.choice([TaskKind.SEND, TaskKind.BROADCAST, TaskKind.BROADCAST,
                           TaskKind.REDUCE])
        k = 1 if kind is TaskKind.SEND else rng.randint(2, min(30, len(devices) - 6))
        picked = rng.sample(devices, k + 1)
        root, receivers = picked[0], tuple(picked[1:])
        parents: tuple[int, ...] = ()
        addends: tuple[int, ...] = ()
        if kind is TaskKind.BROADCAST and rng.random() < 0.5:  # a tree
            parents = tuple(rng.choice((root, *receivers[:j])) for j in range(k))
        if kind is TaskKind.BROADCAST and rng.random() < 0.3:  # a fused sum's addends
            addends = tuple(rng.sample([d for d in devices if d not in picked], 3))
        nbytes = rng.choice([0, 1000, 1 << 20, 3 << 22])
        out.append(Task(kind, 0, ((0, 8),), root, receivers, nbytes, i % 3,
                        parents=parents, addends=addends))
    return out


@pytest.mark.parametrize("name", list(_clusters()))
@pytest.mark.parametrize("seed", range(3))
def test_routes_through_a_shared_memo_are_each_task_s_own(name, seed, monkeypatch):
    cluster = _clusters()[name]
    together = []
    real = cost.batch_routes

    def spy(*args):
        together.append(len(args[0]))
        return real(*args)

    monkeypatch.setattr(cost, "batch_routes", spy)
    rng = random.Random(seed)
    devices = sorted(cluster.host_map)
    known = Routes()
    for _ in range(3):  # plans of one planning call: their memo and its hops shared
        tasks = _tasks(rng, devices, 80)  # enough small ones to be routed together
        got = task_routes(tasks, cluster, known)
        for t, (path, lat) in zip(tasks, got):
            want, want_lat = task_path(t, cluster, Hops())
            assert lat == want_lat  # the same float
            assert list(path) == list(want)
    # the arrays ran where the cluster allows them (no relay pieces, shared bandwidth)
    assert bool(together) == (name in ("uneven", "nics", "preset"))
    hops = known.hops
    assert isinstance(hops, Hops) and hops.cluster is cluster
    assert len(hops) > 0  # edges found once for every plan
    for edge, hop in hops.items():  # each kept hop is the edge's own
        assert hop == cost._hop(*edge, cluster)


def test_a_memo_of_another_cluster_lends_no_hops():
    clusters = _clusters()
    a, b = clusters["uneven"], clusters["nics"]
    known = Routes()
    mine = shared_hops(known, a)
    assert shared_hops(known, a) is mine
    assert shared_hops(known, dataclasses.replace(a)) is mine  # an equal cluster's
    other = shared_hops(known, b)
    assert other is not mine and known.hops is mine
    rng = random.Random(3)
    tasks = _tasks(rng, sorted(a.host_map), 30)
    task_routes(tasks, a, known)  # fills a's hops
    # a memo whose hops are a's answers b's tasks with b's own routes
    lent = Routes()
    lent.hops = mine
    got = task_routes(tasks, b, lent)
    for t, (path, lat) in zip(tasks, got):
        want, want_lat = task_path(t, b, Hops())
        assert lat == want_lat
        assert list(path) == list(want)


@pytest.mark.parametrize("seed", range(8))
def test_the_plain_reach_is_the_loop_s(seed):
    """Without relay pieces, the reach of any edges (chains, trees, devices reached
    twice, senders reached late, zero waits) is the general loop's."""
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    devices = list(range(12))
    edges = [(rng.choice(devices), rng.choice(devices)) for _ in range(n)]
    waits = [rng.choice([0.0, 2e-6, 3.3e-6, 1.1e-5]) for _ in edges]
    reach: dict[int, float] = {}
    for (a, b), w in zip(edges, waits):
        at = reach.get(a, 0.0) + w
        if at > reach.get(b, 0.0):
            reach[b] = at
        else:
            reach.setdefault(b, 0.0)
    assert cost._plain_reach(edges, waits) == max(reach.values())


@pytest.mark.parametrize("name", ["uneven", "nics", "preset"])
@pytest.mark.parametrize("seed", range(4))
def test_routes_found_together_are_each_one_s_loop(name, seed):
    """Random edge lists (devices reached twice, senders reached late, self edges):
    their routes found together (hop_batch) are the loop's codes, and its latency
    wherever no device is reached twice (None there: the loop answers)."""
    from reshard.planner.costing.fairshare import path_arrays
    from reshard.planner.costing.hop_batch import batch_routes

    cluster = _clusters()[name]
    rng = random.Random(seed)
    devices = sorted(cluster.host_map)
    senders, receivers = [], []
    for _ in range(30):
        n = rng.randint(1, min(40, len(devices) - 1))
        if rng.random() < 0.5:  # a tree, each device reached once
            picked = rng.sample(devices, n + 1)
            a = [rng.choice(picked[:j + 1]) for j in range(n)]
            b = picked[1:]
        else:  # anything
            a = [rng.choice(devices) for _ in range(n)]
            b = [rng.choice(devices) for _ in range(n)]
        senders.append(a)
        receivers.append(b)
    hops = Hops()
    got = batch_routes(senders, receivers, *hops.arrays(cluster), cluster.latency,
                       cluster.intra_latency)
    assert got is not None
    task = Task(TaskKind.BROADCAST, 0, ((0, 8),), 0, (1,), 1000)
    once = 0
    for a, b, codes, lat in zip(senders, receivers, *got):
        path, want_lat = cost._hops_path(list(zip(a, b)), task, cluster, hops)
        assert codes.tolist() == path_arrays(path)[0].tolist()
        twice = len(set(b)) < len(b)
        assert (lat is None) == twice
        once += not twice
        assert lat is None or lat == want_lat  # the same float
    assert once >= 10

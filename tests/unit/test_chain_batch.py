"""Chains routed together (issue 62, round sixteen): a batch's chains reached by their
waits' running sums (:func:`~reshard.planner.costing.hop_batch.batch_routes`) are the
loop's, bit for bit, beside trees, stars, devices reached twice and chains back to
their root, on uneven hosts, shuffled (relabeled) devices, several NICs a host, one
host, zero and equal waits; and the plans' routes through the batch are each task's
own."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard import Cluster
from reshard.planner.costing import cost
from reshard.planner.costing.cost import Hops, Routes, task_path, task_routes
from reshard.planner.costing.fairshare import path_arrays
from reshard.planner.costing.hop_batch import batch_routes
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit.test_route_memo import _clusters, _tasks


def _all_clusters() -> dict[str, Cluster]:
    out = _clusters()
    out["one host"] = Cluster((tuple(range(9)),), nics_per_host=2)
    rng = random.Random(11)
    labels = rng.sample(range(200), 48)  # devices named out of order, with gaps
    out["relabeled"] = Cluster(tuple(tuple(labels[i:i + 8]) for i in range(0, 48, 8)),
                               nics_per_host=2, latency=7e-6, intra_latency=3e-6)
    return out


CLUSTERS = _all_clusters()


def _chain_lists(rng: random.Random, devices: list[int]) -> tuple[list[int], list[int]]:
    """A chain's edges: through distinct devices, back to its root, through a device
    twice, or a tree, a star or any edges (not chains)."""
    n = rng.randint(1, min(30, len(devices) - 1))
    picked = rng.sample(devices, n + 1)
    form = rng.choice(["chain", "chain", "back", "twice", "tree", "star", "any"])
    if form == "chain":
        return picked[:-1], picked[1:]
    if form == "back":  # the chain returns to its root, which it reached first at 0
        return picked[:-1] + picked[-1:], picked[1:] + picked[:1]
    if form == "twice":
        b = [*picked[1:], picked[1]]
        return [picked[0], *b[:-1]], b
    if form == "tree":
        return [rng.choice(picked[:j + 1]) for j in range(n)], picked[1:]
    if form == "star":
        return [picked[0]] * n, picked[1:]
    return [rng.choice(devices) for _ in range(n)], [rng.choice(devices) for _ in range(n)]


@pytest.mark.parametrize("name", ["uneven", "nics", "preset", "one host", "relabeled"])
@pytest.mark.parametrize("seed", range(6))
def test_chains_reached_by_running_sums_are_the_loop_s(name, seed):
    cluster = CLUSTERS[name]
    if seed % 2:  # zero and equal waits: sums that tie
        cluster = dataclasses.replace(cluster, latency=0.0, intra_latency=0.0) \
            if seed == 1 else dataclasses.replace(cluster, latency=1e-6, intra_latency=1e-6)
    rng = random.Random(seed)
    devices = sorted(cluster.host_map)
    senders, receivers = zip(*[_chain_lists(rng, devices) for _ in range(60)])
    hops = Hops()
    got = batch_routes(list(senders), list(receivers), *hops.arrays(cluster),
                       cluster.latency, cluster.intra_latency)
    assert got is not None
    task = Task(TaskKind.BROADCAST, 0, ((0, 8),), 0, (1,), 1000)
    chains = 0
    for a, b, codes, lat in zip(senders, receivers, *got):
        path, want_lat = cost._hops_path(list(zip(a, b)), task, cluster, hops)
        assert codes.tolist() == path_arrays(path)[0].tolist()
        twice = len(set(b)) < len(b)
        assert (lat is None) == twice
        assert lat is None or repr(lat) == repr(want_lat)  # the same float
        chains += not twice and all(x == y for x, y in zip(a[1:], b[:-1]))
    assert chains >= 10


@pytest.mark.parametrize("name", ["uneven", "nics", "preset", "one host", "relabeled"])
@pytest.mark.parametrize("seed", range(3))
def test_a_call_of_chains_and_trees_gives_each_its_own_route(name, seed, monkeypatch):
    cluster = CLUSTERS[name]
    rng = random.Random(seed)
    devices = sorted(cluster.host_map)
    together = []
    real = cost.batch_routes

    def spy(*args):
        together.append(len(args[0]))
        return real(*args)

    monkeypatch.setattr(cost, "batch_routes", spy)
    known = Routes()
    for _ in range(3):
        tasks = _tasks(rng, devices, 80)
        got = task_routes(tasks, cluster, known)
        for t, (path, lat) in zip(tasks, got):
            want, want_lat = task_path(t, cluster, Hops())
            assert repr(lat) == repr(want_lat)  # the same float
            assert list(path) == list(want)
    assert together

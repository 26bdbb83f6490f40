"""Round eighteen (issue 62): a call's sends on a cluster without shared bandwidth
are found in one loop (:func:`~reshard.planner.costing.cost._send_batch`: each
:func:`~reshard.planner.costing.cost._hop` inline), the broadcasts' read-only
fractions read once per length (:func:`~reshard.planner.costing.cost._batch`), and
:func:`~reshard.planner.costing.cost.task_routes` searches a key it lacks twice from
its last task. Each is checked against the path it replaces: the same resources,
fractions, codes, latency and hops, sends met again and not."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard.cluster import Cluster
from reshard.planner.costing import cost
from reshard.planner.costing.cost import Hops, Routes, task_routes
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit.test_route_memo import _clusters, _tasks


def _sends(rng: random.Random, devices: list[int], n: int) -> list[Task]:
    out = []
    for i in range(n):
        a, b = rng.sample(devices, 2)
        out.append(Task(TaskKind.SEND, 0, ((0, 8),), a, (b,), rng.choice([0, 1 << 20]), i % 3))
    return out


def _plain() -> dict[str, Cluster]:
    got = {name: c for name, c in _clusters().items() if not c.shared_bandwidth}
    got["latencies"] = dataclasses.replace(got["uneven"], latency=3e-6, intra_latency=7e-7)
    return got


@pytest.mark.parametrize("name", list(_plain()))
@pytest.mark.parametrize("seed", range(4))
def test_send_batch_is_send_route(name, seed):
    cluster = _plain()[name]
    rng = random.Random(seed)
    devices = sorted(cluster.host_map)
    tasks = _sends(rng, devices, 60) + _tasks(rng, devices, 20)
    tasks += [rng.choice(tasks) for _ in range(20)]  # edges met again
    rng.shuffle(tasks)
    items = [((i,), t) for i, t in enumerate(tasks)]
    found: list = [None] * len(items)
    hops, want_hops = Hops(), Hops()
    for e in rng.sample([(t.root, t.receivers[0]) for t in tasks if t.kind is TaskKind.SEND], 5):
        hops[e] = want_hops[e] = cost._hop(*e, cluster)  # some hops known before
    cost._send_batch(items, cluster, hops, found)
    sends = 0
    for (_, t), got in zip(items, found):
        if t.kind is not TaskKind.SEND:
            assert got is None
            continue
        sends += 1
        path, lat = cost._send_route(t, cluster, want_hops)
        assert lat == got[1]
        assert list(got[0]) == list(path)
        assert got[0].codes == path.codes and got[0].whole == path.whole
        assert [type(f) for _, f in got[0]] == [type(f) for _, f in path]
    assert sends and hops == want_hops  # each edge's hop, kept


@pytest.mark.parametrize("name", list(_clusters()))
@pytest.mark.parametrize("seed", range(3))
def test_routes_of_keys_met_again_are_each_task_s_own(name, seed):
    cluster = _clusters()[name]
    rng = random.Random(seed)
    devices = sorted(cluster.host_map)
    tasks = _tasks(rng, devices, 70) + _sends(rng, devices, 40)
    tasks += [dataclasses.replace(rng.choice(tasks), step=5) for _ in range(30)]
    rng.shuffle(tasks)
    routes = task_routes(tasks, cluster, Routes())
    for t, (path, lat) in zip(tasks, routes):
        want, want_lat = cost.task_path(t, cluster, Hops())
        assert lat == want_lat
        assert list(path) == list(want)

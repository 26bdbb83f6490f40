"""A call's route keys made together (:func:`~reshard.planner.costing.route_keys.
route_keys`) and the routes :func:`~reshard.planner.costing.cost.task_routes` finds
only for the keys its memo lacks, a send read from its hop (issue 62, round
fourteen): each key is :func:`route_key`'s, each route the task's own found alone."""

from __future__ import annotations

import random

import pytest

from reshard.planner.costing import cost
from reshard.planner.costing.cost import Hops, Routes, task_path, task_routes
from reshard.planner.costing.fairshare import Path, path_arrays
from reshard.planner.costing.route_keys import HASH_ONCE, route_key, route_keys
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit.test_route_memo import _clusters, _tasks


def _large(rng: random.Random, n: int) -> list[Task]:
    """Broadcasts of :data:`HASH_ONCE` receivers or more (keys hashed by a sample)."""
    out = []
    for i in range(n):
        k = rng.randint(HASH_ONCE - 1, HASH_ONCE + 40)
        picked = rng.sample(range(400), k + 1)
        parents = tuple(rng.choice(picked[:j + 1]) for j in range(k)) \
            if rng.random() < 0.5 else ()
        out.append(Task(TaskKind.BROADCAST, 0, ((0, 8),), picked[0], tuple(picked[1:]),
                        rng.choice([0, 1000, 3 << 22]), i % 3, parents=parents))
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("piece", "per_message"), [(0, False), (1 << 16, False),
                                                    (0, True), (1 << 16, True)])
def test_keys_made_together_are_each_task_s_own(seed, piece, per_message):
    from reshard.cluster import pipeline_piece

    rng = random.Random(seed)
    tasks = _tasks(rng, list(range(40)), 60) + _large(rng, 12)
    rng.shuffle(tasks)
    riders = set(rng.sample(range(len(tasks)), 9)) if per_message else set()
    got = route_keys(tasks, piece, per_message, riders)
    want = [route_key(t, pipeline_piece(piece, t.nbytes), t.nbytes if per_message else 0,
                      i in riders) for i, t in enumerate(tasks)]
    assert got == want
    assert [hash(k) for k in got] == [hash(k) for k in want]
    assert [type(k) for k in got] == [type(k) for k in want]  # large ones sampled alike


@pytest.mark.parametrize("name", list(_clusters()))
@pytest.mark.parametrize("seed", range(3))
def test_routes_are_each_task_s_own_and_shared_by_key(name, seed):
    """Sends (read from their hops where the cluster has no shared bandwidth), chains,
    trees and sums, some met twice and some known before the call: each route the
    task's own (the same codes, fractions and float latency, a send's codes known
    alone as its own search's are), tasks of one key share one route, a known route
    is returned as it is."""
    cluster = _clusters()[name]
    rng = random.Random(seed)
    devices = sorted(cluster.host_map)
    tasks = _tasks(rng, devices, 70)
    sends = [Task(TaskKind.SEND, 0, ((0, 8),), a, (b,), rng.choice([0, 1000, 1 << 20]), 0)
             for a, b in (rng.sample(devices, 2) for _ in range(50))]
    tasks += sends + sends[:11] + tasks[:9]
    rng.shuffle(tasks)
    known = Routes()
    first = task_routes(tasks[:20], cluster, known)
    got = task_routes(tasks, cluster, known)
    assert all(a is b for a, b in zip(first, got[:20]))  # known before: kept
    by_key: dict[object, object] = {}
    piece = cluster.relay_piece
    per_message = bool((cluster.message_cost or cluster.part_cost) and cluster.shared_bandwidth)
    for t, route in zip(tasks, got):
        path, lat = route
        want, want_lat = task_path(t, cluster, Hops())
        assert lat == want_lat
        assert list(path) == list(want)
        codes, frac = path_arrays(path)
        want_codes, want_frac = path_arrays(want)
        assert codes.tolist() == want_codes.tolist() and frac.tolist() == want_frac.tolist()
        if t.kind is TaskKind.SEND and not cluster.shared_bandwidth:
            assert isinstance(path, Path) and isinstance(want, Path)
            assert path.codes == want.codes  # known by codes alone, as its search's
        key = route_key(t, cost.pipeline_piece(piece, t.nbytes),
                        t.nbytes if per_message else 0, False)
        assert by_key.setdefault(key, route) is route  # one route a key
        assert known[key] is route


@pytest.mark.parametrize("name", ["uneven", "nics", "preset"])
def test_sends_found_once(name, monkeypatch):
    """A call over a memo that holds every route searches none and finds no hop."""
    cluster = _clusters()[name]
    rng = random.Random(3)
    devices = sorted(cluster.host_map)
    tasks = [Task(TaskKind.SEND, 0, ((0, 8),), a, (b,), 1000, 0)
             for a, b in (rng.sample(devices, 2) for _ in range(40))]
    known = Routes()
    got = task_routes(tasks, cluster, known)
    calls: list[int] = []
    real_hop, real_path = cost._hop, cost.task_path
    monkeypatch.setattr(cost, "_hop", lambda *a: calls.append(1) or real_hop(*a))
    monkeypatch.setattr(cost, "task_path", lambda *a, **k: calls.append(1) or real_path(*a, **k))
    again = task_routes(tasks, cluster, known)
    assert not calls
    assert all(a is b for a, b in zip(got, again))

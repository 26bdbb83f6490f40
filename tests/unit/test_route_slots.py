"""The routes :func:`~reshard.planner.costing.cost.task_routes` finds are handed back
by place (issue 62, round fifteen: the batches and the loop fill a list in the order
the keys a call lacks are first met, the memo is filled once at the end, and where no
key is lacked twice the tasks take that list in order): with keys met again and not,
each task's route is the memo's route of its key (the same object, shared by every
task of that key), its own found alone, and a second call finds every route in the
memo and searches none."""

from __future__ import annotations

import random

import pytest

from reshard.planner.costing import cost
from reshard.planner.costing.cost import Hops, Routes, task_path, task_routes
from reshard.planner.costing.fairshare import path_arrays
from reshard.planner.costing.route_keys import route_keys
from tests.unit.test_route_memo import _clusters, _tasks


def _keys(tasks, cluster):
    per_message = bool((cluster.message_cost or cluster.part_cost)
                       and cluster.shared_bandwidth)
    return route_keys(tasks, cluster.relay_piece, per_message, set())


@pytest.mark.parametrize("name", list(_clusters()))
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("twice", [0, 25])
def test_each_task_gets_its_keys_route_by_place(name, seed, twice, monkeypatch):
    cluster = _clusters()[name]
    rng = random.Random(seed)
    devices = sorted(cluster.host_map)
    tasks = _tasks(rng, devices, 80)
    earlier = rng.sample(tasks, 9)  # some keys known before the call
    tasks += [rng.choice(tasks) for _ in range(twice)]  # keys met again, anywhere
    rng.shuffle(tasks)
    known = Routes()
    task_routes(earlier, cluster, known)
    before = dict(known)
    routes = task_routes(tasks, cluster, known)
    keys = _keys(tasks, cluster)
    assert len(routes) == len(tasks)
    lacked = [k for k in keys if k not in before]
    assert (len(set(lacked)) < len(lacked)) == bool(twice)  # each path taken
    for t, key, route in zip(tasks, keys, routes):
        assert route is known[key]  # the memo's, shared by the key's tasks
        if key in before:
            assert route is before[key]
        want, want_lat = task_path(t, cluster, Hops())
        assert route[1] == want_lat
        assert path_arrays(route[0])[0].tolist() == path_arrays(want)[0].tolist()
        assert list(route[0]) == list(want)
    assert set(known) == set(before) | set(keys)
    searched: list[int] = []
    real = cost.task_path

    def spy(*args, **kwargs):
        searched.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(cost, "task_path", spy)
    again = task_routes(list(reversed(tasks)), cluster, known)
    assert not searched
    assert all(a is b for a, b in zip(again, reversed(routes)))

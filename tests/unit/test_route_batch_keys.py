"""The routes :func:`~reshard.planner.costing.cost.task_routes` finds together
(:func:`~reshard.planner.costing.cost._batch`) are stored under the very keys its own
loop reads (issue 62, round thirteen: the keys are made once and handed to the batch):
each task's route is its own, found alone, and a second call over the same memo finds
every route there, searching none."""

from __future__ import annotations

import random

import pytest

from reshard.planner.costing import cost
from reshard.planner.costing.cost import Hops, Routes, task_routes
from reshard.planner.costing.route_keys import route_key
from tests.unit.test_route_memo import _clusters, _tasks


@pytest.mark.parametrize("name", ["uneven", "nics", "preset"])
@pytest.mark.parametrize("seed", range(3))
def test_batched_routes_are_read_back_by_the_loop(name, seed, monkeypatch):
    cluster = _clusters()[name]
    rng = random.Random(seed)
    devices = sorted(cluster.host_map)
    tasks = _tasks(rng, devices, 90)
    tasks += tasks[:7]  # tasks met twice in one call
    searched: list[int] = []
    batched: list[int] = []
    real_path, real_batch = cost.task_path, cost.batch_routes

    def path_spy(*args, **kwargs):
        searched.append(1)
        return real_path(*args, **kwargs)

    def batch_spy(*args):
        batched.append(len(args[0]))
        return real_batch(*args)

    monkeypatch.setattr(cost, "task_path", path_spy)
    monkeypatch.setattr(cost, "batch_routes", batch_spy)
    known = Routes()
    got = task_routes(tasks, cluster, known)
    assert batched and batched[0] >= cost.BATCH_FROM  # the batch ran
    small = [t for t in tasks if t.kind in cost._SHIFTED and
             len(t.receivers) + len(t.addends) < cost.ARRAY_EDGES]
    assert len(searched) < len(small) // 2  # most small ones read from the batch's
    for t, (path, lat) in zip(tasks, got):
        want, want_lat = real_path(t, cluster, Hops())
        assert lat == want_lat  # the same float
        assert list(path) == list(want)
    for t in tasks:  # every route under the loop's key, the batch's ones included
        assert route_key(t, 0, 0, False) in known
    searched.clear()
    again = task_routes(small, cluster, known)
    assert not searched  # read back, none searched again
    assert [id(p) for p, _ in again] == [id(known[route_key(t, 0, 0, False)][0])
                                         for t in small]


@pytest.mark.parametrize("name", ["uneven", "preset"])
def test_batched_paths_share_read_only_ones(name):
    """The batch's paths' fractions: ones, read only, one array per length (kept with
    the memo's hops), as the paths numbered back by form have them; their codes
    unchanged."""
    import numpy as np

    from reshard.planner.costing.fairshare import path_arrays

    cluster = _clusters()[name]
    tasks = _tasks(random.Random(5), sorted(cluster.host_map), 90)
    known = Routes()
    got = task_routes(tasks, cluster, known)
    by_length: dict[int, np.ndarray] = {}
    batched = 0
    for t, (path, _) in zip(tasks, got):
        codes, frac = path_arrays(path)
        want = path_arrays(cost.task_path(t, cluster, Hops())[0])
        assert codes.tolist() == want[0].tolist() and frac.tolist() == want[1].tolist()
        if frac.flags.writeable:
            continue  # a path found alone
        batched += 1
        assert (frac == 1.0).all()
        assert by_length.setdefault(len(frac), frac) is frac  # shared by length
        assert known.hops is not None and known.hops.ones()[len(frac)] is frac
        with pytest.raises(ValueError):
            frac[0] = 0.5  # a writer raises, changing no other path
    assert batched >= cost.BATCH_FROM

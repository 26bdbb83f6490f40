"""Chains' devices share their ints, and a double tree's second half is taken in two
slices (issue 62 round thirteen): :func:`chain_cuts.cut_all`'s long chains on a
cluster hold one int object per device id (equal to their task's root and receivers,
where each task had its own objects), every chain as :func:`chain_cuts.chain_of`
finds it alone; a picker of two long runs takes what a loop over its places takes, and
``treeify`` over such chains gives the tasks it gave from the tasks' own devices."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.cells import chain_cuts, trees
from reshard.planner.cells.trees import TREE_FORMS
from reshard.planner.values.tasks import Task, TaskKind


def _own(items: list[int]) -> tuple[int, ...]:
    """``items`` as fresh int objects (as a plan's tasks each have their own)."""
    return tuple(int(str(d)) for d in items)


def _plan(rng: random.Random, cluster: Cluster) -> list[Task]:
    tasks = []
    for k in range(rng.randint(3, 9)):
        chain = rng.sample(cluster.devices, rng.choice([70, 130, len(cluster.devices)]))
        chain.sort(key=lambda d: (cluster.host_of(d), rng.random()))  # host by host
        if rng.random() < 0.3:  # hosts entered again
            i, j = sorted(rng.sample(range(1, len(chain)), 2))
            chain[i:j] = reversed(chain[i:j])
        if rng.random() < 0.2:
            chain.append(chain[1])  # a device twice: no form
        through = tuple(d for d in chain[1:-1] if rng.random() < 0.1)
        devices = _own(chain)
        tasks.append(Task(TaskKind.BROADCAST, 0, ((k * 8, k * 8 + 8),), devices[0],
                          devices[1:], 64, through=through))
    return tasks


def _cluster(rng: random.Random) -> Cluster:
    ids = rng.sample(range(1000, 1400), 320)  # ints Python does not share itself
    return Cluster(tuple(tuple(ids[h * 8:h * 8 + 8]) for h in range(40)))


@pytest.mark.parametrize("seed", range(6))
def test_long_chains_share_one_int_per_device(seed):
    rng = random.Random(seed)
    cluster = _cluster(rng)
    tasks = _plan(rng, cluster)
    memo: chain_cuts.Segments = {}
    chain_cuts.cut_all(tasks, cluster.host_of, memo, lambda cut: True)
    objects: dict[int, int] = {}
    for t in tasks:
        chain = memo[id(t)][2]  # type: ignore[misc]
        assert chain == chain_cuts.chain_of(t, cluster.host_of)
        assert chain.devices == (t.root, *t.receivers) and chain.receivers is t.receivers
        assert all(type(d) is int for d in chain.devices)
        for d in chain.devices:
            assert objects.setdefault(d, id(d)) == id(d)  # one object per id
    assert len(objects) > len(tasks[0].receivers)


@pytest.mark.parametrize("seed", range(4))
def test_two_runs_are_taken_as_the_loop_takes(seed):
    rng = random.Random(seed)
    for _ in range(200):
        size = rng.choice([40, 200, 1025])
        devices = tuple(rng.sample(range(5000), size))
        chain = chain_cuts.Chain(devices, devices[1:], None)
        cut = rng.randrange(2, size - 1)
        places = [*range(cut, size), *range(1, cut)]  # hosts turned: two runs
        if rng.random() < 0.5:
            places = [*range(cut), *range(cut + 1, size)]  # one place left out
        got = trees._picker(places, size)(chain)
        assert type(got) is tuple and got == tuple(devices[p] for p in places)


@pytest.mark.parametrize("seed", range(4))
def test_treeify_of_shared_ints_is_treeify_of_the_tasks_own(seed):
    rng = random.Random(seed)
    cluster = _cluster(rng)
    tasks = _plan(rng, cluster)
    memo: trees.Segments = {}
    for shape, intra in TREE_FORMS:
        own: trees.Segments = {}  # each chain found alone: the tasks' own ints
        for t in tasks:
            if trees._applies(t, cluster.host_of, shape):
                chain_cuts.chain_of(t, cluster.host_of, own)
        want = trees.treeify(tasks, cluster.host_of, intra, shape, own)
        assert trees.treeify(tasks, cluster.host_of, intra, shape, memo) == want
        assert want != tuple(tasks)

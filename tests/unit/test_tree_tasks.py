"""Round fourteen's cheaper cell planning (issue 62, branch issue-62fe), each against
the path it replaced: a reshaped chain's tasks built slot by slot
(:func:`new_tasks.tree_task`) are ``dataclasses.replace``'s; ``treeify`` of chains
with fused sums, later steps, ``dst`` sources and bytes that are no multiple of the
box gives a loop's tasks; :func:`trees.reshapes` (a loop reading the memo's cuts) is
``any`` over :func:`chain_cuts.cut`; :func:`chain_memo._ranks` (a scan of the sorted
distinct values for few) is the dense rank by a table."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard import Cluster
from reshard.planner.cells import chain_cuts, chain_memo, trees
from reshard.planner.cells.new_tasks import TASK_FIELDS, tree_task
from reshard.planner.cells.trees import TREE_FORMS
from reshard.planner.values.tasks import Buffer, Task, TaskKind
from tests.unit.test_tree_pickers import _loop  # each chain reshaped alone, by replace


def _task(rng: random.Random, receivers: tuple[int, ...], root: int) -> Task:
    """A broadcast with any of the fields a tree keeps set."""
    box = tuple((a, a + rng.choice([0, 1, 3, 8])) for a in range(rng.randrange(4)))
    addends = tuple(rng.sample(range(500, 600), rng.randrange(3)))
    return Task(TaskKind.BROADCAST, rng.randrange(3), box, root, receivers,
                rng.randrange(10**5), rng.randrange(4), rng.choice(list(Buffer)),
                (box,) * rng.randrange(2), (), (), addends,
                tuple(rng.choice([root, *addends]) for _ in addends) if rng.random() < 0.5
                else ())


@pytest.mark.parametrize("seed", range(4))
def test_a_tree_task_is_the_replaced_task(seed):
    rng = random.Random(seed)
    for _ in range(300):
        t = _task(rng, tuple(rng.sample(range(64), rng.randint(1, 9))), 70)
        box = tuple((a, b - rng.randrange(b - a + 1)) for a, b in t.box)
        receivers = tuple(rng.sample(range(64), rng.randint(1, 9)))
        parents = tuple(rng.choice([t.root, *receivers]) for _ in receivers)
        through = tuple(d for d in receivers if rng.random() < 0.3)
        nbytes = rng.randrange(10**5)
        want = dataclasses.replace(t, box=box, receivers=receivers, nbytes=nbytes,
                                   through=through, parents=parents)
        got = tree_task(t, box, receivers, nbytes, through, parents)
        assert type(got) is Task
        assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
        for name in TASK_FIELDS:
            assert getattr(got, name) is getattr(want, name), name


def _plan(rng: random.Random, cluster: Cluster) -> list[Task]:
    devices = list(cluster.devices)
    tasks = []
    for _ in range(rng.randint(2, 8)):
        chain = rng.sample(devices, rng.choice([2, 3, 9, 30, 70, len(devices) - 1]))
        chain.sort(key=lambda d: (cluster.host_of(d), rng.random()))
        if rng.random() < 0.2:
            chain.reverse()  # the root's host last
        t = _task(rng, tuple(chain[1:]), chain[0])
        through = tuple(d for d in chain[1:-1] if rng.random() < 0.1)
        tasks.append(dataclasses.replace(t, through=through))
    t = tasks[0]
    tasks.append(dataclasses.replace(t, parents=(t.root, *t.receivers[:-1])))
    tasks.append(Task(TaskKind.SEND, 0, t.box, t.root, t.receivers[:1], t.nbytes))
    rng.shuffle(tasks)
    return tasks


@pytest.mark.parametrize("seed", range(6))
def test_treeify_of_sums_steps_and_sources_is_each_chain_reshaped_alone(seed):
    rng = random.Random(seed)
    ids = rng.sample(range(400), 128)
    cluster = Cluster(tuple(tuple(ids[h * 8:h * 8 + 8]) for h in range(16)))
    changed = 0
    for host in (cluster.host_of, lambda d: cluster.host_of(d)):
        tasks = _plan(rng, cluster)
        memo: trees.Segments = {}
        for shape, intra in rng.sample(TREE_FORMS, len(TREE_FORMS)):
            want = _loop(tasks, host, intra, shape)
            assert trees.treeify(tasks, host, intra, shape, memo) == want
            assert trees.treeify(tasks, host, intra, shape) == want
            changed += want != tuple(tasks)
    assert changed


@pytest.mark.parametrize("seed", range(6))
def test_reshapes_is_any_chain_the_shape_applies_to(seed):
    rng = random.Random(seed)
    cluster = Cluster(tuple(tuple(range(h * 8, h * 8 + 8)) for h in range(16)))
    answers = set()
    for _ in range(40):
        tasks = _plan(rng, cluster)[:rng.randint(1, 4)]
        memo: trees.Segments = {}
        for t in rng.sample(tasks, rng.randrange(len(tasks) + 1)):  # some cut before
            if t.kind is TaskKind.BROADCAST and not t.parents:
                chain_cuts.cut(t, cluster.host_of, memo)
        for shape in trees.SHAPES:
            want = any(t.kind is TaskKind.BROADCAST and not t.parents and
                       trees._APPLIES[shape](chain_cuts.cut(t, cluster.host_of))
                       for t in tasks)
            assert trees.reshapes(tasks, cluster.host_of, shape, memo) is want
            assert trees.reshapes(tasks, cluster.host_of, shape) is want
            answers.add(want)
    assert answers == {True, False}


def _dense(values: tuple[float, ...]) -> tuple[int, ...]:
    rank = {v: i for i, v in enumerate(sorted(set(values)))}
    return tuple(rank[v] for v in values)


@pytest.mark.parametrize("seed", range(4))
def test_ranks_are_the_dense_ranks(seed):
    rng = random.Random(seed)
    pool = [0.0, -0.0, 1.0, 2.5, 1e6, 1e6 + 1, float("inf"), 3.0, 7.0]
    for _ in range(500):
        n = rng.choice([1, 2, 3, 8, chain_memo.INDEX_RANKS, chain_memo.INDEX_RANKS + 1, 40])
        values = tuple(rng.choice(pool[:rng.randint(1, len(pool))]) for _ in range(n))
        assert chain_memo._ranks(values) == _dense(values)
    assert chain_memo._ranks((2.0, 0.0, -0.0, 2.0, 1.0)) == (2, 0, 0, 2, 1)

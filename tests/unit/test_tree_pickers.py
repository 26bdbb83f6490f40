"""Trees taken from their chains by place (issue 62 round eleven): a picker
(:func:`trees._picker`) takes the items a loop over the places takes (all the
receivers: the chain's own tuple; a few long runs: slices; else one by one), and
``treeify`` (chains cut at once, trees by form, boxes split once per call) gives the
tasks of a loop reshaping each chain alone from its own trees (``trees._trees_of``),
for every tree form, with and without the search's memo."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard import Cluster
from reshard.layout import box_size
from reshard.planner.cells import chain_cuts, trees
from reshard.planner.cells.cell_tasks import split_box
from reshard.planner.cells.trees import TREE_FORMS, Intra
from reshard.planner.values.tasks import Task, TaskKind


def _places(rng: random.Random, size: int) -> list[int]:
    """Places as trees take them: all receivers, rotated host blocks, runs with a
    repeated entry, scattered, one, none."""
    a, b = sorted(rng.sample(range(1, size), 2))
    kind = rng.randrange(7)
    if kind == 0:
        return list(range(1, size))
    if kind == 1:
        return [*range(1, a), *range(b, size), *range(a, b)]
    if kind == 2:
        return [*range(a, b)]
    if kind == 3:  # a star's parents: each entry repeated
        return [p for e in range(1, size, 8) for p in [rng.randrange(e)] + [e] * 7]
    if kind == 4:
        return [rng.randrange(size) for _ in range(rng.randint(1, size))]
    if kind == 5:
        return [rng.randrange(size)]
    return []


@pytest.mark.parametrize("seed", range(6))
def test_a_picker_takes_what_the_loop_takes(seed):
    rng = random.Random(seed)
    kinds = set()
    for _ in range(300):
        size = rng.choice([3, 9, 40, 200, 1025])
        devices = tuple(rng.sample(range(5000), size))
        chain = chain_cuts.Chain(devices, devices[1:], None)
        places = _places(rng, size)
        got = trees._picker(places, size)(chain)
        assert type(got) is tuple and got == tuple(devices[p] for p in places)
        if places == list(range(1, size)):
            assert got is chain.receivers  # the tuple itself, not a copy
        kinds.add(len(places))
    assert 0 in kinds and 1 in kinds


def _loop(tasks: list[Task], host, intra: Intra, shape) -> tuple[Task, ...]:  # type: ignore[no-untyped-def]
    """Each chain a shape reshapes, alone, from its own trees; the rest as they are."""
    out: list[Task] = []
    for t in tasks:
        if t.kind is not TaskKind.BROADCAST or t.parents or not trees._APPLIES[shape](
                chain_cuts.segments(t, host)):
            out.append(t)
            continue
        found = trees._trees_of(t, host, intra, shape)
        boxes = split_box(t.box, 2) if len(found) == 2 else (t.box,)
        itemsize = t.nbytes // box_size(t.box) if box_size(t.box) else 0
        for box, (parents, receivers, through) in zip(boxes, found):
            if box_size(box) * itemsize:
                out.append(dataclasses.replace(t, box=box, receivers=receivers,
                                               nbytes=box_size(box) * itemsize,
                                               through=through, parents=parents))
    return tuple(out)


def _plan(rng: random.Random, cluster: Cluster) -> list[Task]:
    devices = list(cluster.devices)
    tasks = []
    for _ in range(rng.randint(2, 8)):
        chain = rng.sample(devices, rng.choice([3, 9, 30, 70, 150, len(devices) - 1]))
        chain.sort(key=lambda d: (cluster.host_of(d), rng.random()))  # host by host
        if rng.random() < 0.3:  # hosts entered again
            i, j = sorted(rng.sample(range(1, len(chain)), 2))
            chain[i:j] = reversed(chain[i:j])
        if rng.random() < 0.1:
            chain.append(chain[1])  # a device twice
        through = tuple(d for d in chain[1:-1] if rng.random() < 0.1)
        rows = rng.choice([1, 2, 7, 64])
        for k in range(rng.randint(1, 3)):  # a box's pieces repeat their chain
            box = ((k * 64, k * 64 + rows), (0, rng.choice([0, 3, 8])))
            tasks.append(Task(TaskKind.BROADCAST, 0, box, chain[0], tuple(chain[1:]),
                              box_size(box) * 2, k, through=through))
    t = tasks[0]
    tasks.append(dataclasses.replace(t, receivers=(*t.receivers[:1], *t.receivers[1:])))  # a copy
    tasks.append(dataclasses.replace(t, parents=(t.root, *t.receivers[:-1])))
    tasks.append(Task(TaskKind.SEND, 0, t.box, t.root, t.receivers[:1], t.nbytes))
    rng.shuffle(tasks)
    return tasks


@pytest.mark.parametrize("seed", range(6))
def test_treeify_is_each_chain_reshaped_alone(seed):
    rng = random.Random(seed)
    ids = rng.sample(range(300), 256)
    cluster = Cluster(tuple(tuple(ids[h * 8:h * 8 + 8]) for h in range(32)))
    changed = 0
    for host in (cluster.host_of, lambda d: cluster.host_of(d)):
        tasks = _plan(rng, cluster)
        memo: trees.Segments = {}  # the search's, one per plan for every form
        forms = [*rng.sample(TREE_FORMS, len(TREE_FORMS)), (rng.choice(trees.SHAPES), Intra.CHAIN)]
        for shape, intra in forms:
            want = _loop(tasks, host, intra, shape)
            assert trees.treeify(tasks, host, intra, shape, memo) == want
            assert trees.treeify(iter(tasks), host, intra, shape) == want
            changed += want != tuple(tasks)
    assert changed

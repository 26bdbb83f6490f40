"""new_tasks.new_task (every cell planner's and run planner's tasks built slot by slot)
against the dataclass's constructor: equal tasks, field by field, hashes, reprs and
forms included, with every keyword it takes."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard.planner.cells.decompose import Cell
from reshard.planner.cells.new_tasks import TASK_FIELDS, broadcast_runs_tasks, new_task
from reshard.planner.values.tasks import Buffer, Task, TaskKind


def test_chain_tasks_are_the_constructors_tasks():
    for kind, receivers in ((TaskKind.SEND, (9,)), (TaskKind.BROADCAST, (9, 10, 3))):
        for step in (0, 2):
            args = (kind, 1, ((0, 4), (8, 16)), 5, receivers, 4096, step)
            want, got = Task(*args), new_task(*args)
            assert type(got) is Task
            assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
            for name in TASK_FIELDS:
                assert getattr(got, name) == getattr(want, name), name
            assert got.at_step(step + 1) == want.at_step(step + 1)


def test_task_fields_are_the_dataclass_s():
    fields = dataclasses.fields(Task)
    assert tuple(f.name for f in fields) == TASK_FIELDS
    defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    assert defaults == {"step": 0, "source": Buffer.SRC, "pieces": (), "through": (),
                        "parents": (), "addends": (), "addend_parents": ()}


@pytest.mark.parametrize("seed", range(4))
def test_new_task_is_the_dataclass_s_task(seed):
    rng = random.Random(seed)
    for _ in range(200):
        kind = rng.choice(list(TaskKind))
        box = tuple((a, a + rng.randrange(9)) for a in range(rng.randrange(4)))
        args = (kind, rng.randrange(3), box, rng.randrange(-1, 9),
                tuple(rng.sample(range(16), rng.randrange(1, 5))), rng.randrange(10**6),
                rng.randrange(4))
        extra = {}
        if rng.random() < 0.5:
            extra["through"] = tuple(rng.sample(range(16), rng.randrange(3)))
        if rng.random() < 0.5:
            extra["source"] = rng.choice(list(Buffer))
        if rng.random() < 0.5:
            extra["pieces"] = (box, box)
        got, want = new_task(*args, **extra), Task(*args, **extra)
        assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
        for name in TASK_FIELDS:  # every slot set, to the same object
            assert getattr(got, name) is getattr(want, name) or \
                getattr(got, name) == getattr(want, name)


@pytest.mark.parametrize("seed", range(3))
def test_broadcast_runs_tasks_are_the_dataclass_s_broadcasts(seed):
    rng = random.Random(seed)
    run, roots, chains, nbytes, want = [], [], [], [], []
    for _ in range(150):
        box = tuple((a, a + rng.randrange(1, 9)) for a in range(rng.randrange(1, 4)))
        cell = Cell(box, frozenset({rng.randrange(16)}), frozenset(range(4)))
        tensor, step = rng.randrange(3), rng.randrange(4)
        root, nb = rng.randrange(16), rng.randrange(10**6)
        chain = tuple(rng.sample(range(16, 32), rng.randrange(1, 5)))
        run.append((cell, tensor, rng.choice([1, 2, 4]), step))
        roots.append(root)
        chains.append(chain)
        nbytes.append(nb)
        want.append([Task(TaskKind.BROADCAST, tensor, box, root, chain, nb, step)])
    got = broadcast_runs_tasks(run, roots, chains, nbytes)
    assert got == want
    for [g], [w] in zip(got, want):
        assert hash(g) == hash(w) and repr(g) == repr(w)
        for name in TASK_FIELDS:
            assert getattr(g, name) == getattr(w, name), name

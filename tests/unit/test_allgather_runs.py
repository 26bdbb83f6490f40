"""new_task and plan_allgathers (planner/cells/cell_tasks.py, the run planner work.py uses for the
``allgather`` strategy) against plan_allgather of each cell in turn: the same tasks
in the same order and the same loads left behind, over runs whose cells repeat their
holders and needers (the memo's key), also as equal sets built in other orders;
new_task against the dataclass's own constructor."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard import Cluster
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.cell_tasks import (
    RUN_PLANNERS,
    TASK_FIELDS,
    new_task,
    plan_allgather,
    plan_allgathers,
)
from reshard.planner.cells.decompose import Cell
from reshard.planner.values.tasks import Buffer, Task, TaskKind


def _tables(loads):
    return [list(getattr(loads, name).items()) for name in
            ("nic_out", "nic_in", "dev_out", "dev_in")]


def _run(rng, devices):
    # a few holder sets and needer sets, paired every way (a key of one set alone
    # would mix pairs)
    holder_sets = [rng.sample(devices, rng.choice([1, 2, 5, 8, 16])) for _ in range(3)]
    needer_sets = [rng.sample(devices, rng.choice([3, 8, 20, 40])) for _ in range(3)]
    run = []
    for k in range(40):
        holders, needers = rng.choice(holder_sets), rng.choice(needer_sets)
        # equal sets, built in another order (their iteration order may differ)
        holders = frozenset(rng.sample(holders, len(holders)))
        needers = frozenset(rng.sample(needers, len(needers)))
        rows = rng.choice([1, 3, 7, 96])
        box = ((k * 100, k * 100 + rows), (0, rng.choice([5, 64])))
        run.append((Cell(box, holders, needers), k % 3, rng.choice([2, 4]), k // 5))
    return run


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("preset", ["dgx-h100", None])
def test_allgather_run_is_each_cell_in_turn(seed, preset):
    rng = random.Random(seed)
    cluster = Cluster.regular(6, 8, preset=preset) if preset else Cluster.regular(6, 8)
    a, b = Loads(cluster), Loads(cluster)
    run = _run(rng, list(range(48)))
    want = [plan_allgather(cell, tensor, size, a, step) for cell, tensor, size, step in run]
    got = plan_allgathers(run, b)
    assert got == want
    assert _tables(b) == _tables(a)


def test_allgather_has_its_run_planner():
    assert RUN_PLANNERS[plan_allgather] is plan_allgathers


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

"""new_tasks.chain_task (the run planners' tasks built slot by slot) against the
dataclass's constructor: equal tasks, field by field, hashes and forms included."""

from __future__ import annotations

import dataclasses

from reshard.planner.cells.new_tasks import FIELDS, chain_task
from reshard.planner.values.tasks import Task, TaskKind


def test_fields_are_the_dataclass_fields_in_order():
    assert tuple(f.name for f in dataclasses.fields(Task)) == FIELDS


def test_chain_task_is_the_constructors_task():
    for kind, receivers in ((TaskKind.SEND, (9,)), (TaskKind.BROADCAST, (9, 10, 3))):
        for step in (0, 2):
            args = (kind, 1, ((0, 4), (8, 16)), 5, receivers, 4096, step)
            want, got = Task(*args), chain_task(*args)
            assert type(got) is Task
            assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
            for name in FIELDS:
                assert getattr(got, name) == getattr(want, name), name
            assert got.at_step(step + 1) == want.at_step(step + 1)

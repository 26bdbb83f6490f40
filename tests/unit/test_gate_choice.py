""":func:`~reshard.planner.costing.stepgate.gate_of` reads every step once as an array
and asks first whether every task has receivers (then each has a device): the same
choice as the rule task by task (one step, each task a device), and a full gate given
the steps read is the one that reads them itself."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.costing.stepgate import OneStep, StepGate, gate_of, has_device
from reshard.planner.values.tasks import Task, TaskKind


def _old_choice(tasks) -> type:
    if tasks:
        first = tasks[0].step
        if all(t.step == first and has_device(t) for t in tasks):
            return OneStep
    return StepGate


def _task(rng: random.Random, step: int) -> Task:
    kind = rng.choice([TaskKind.BROADCAST, TaskKind.COPY, TaskKind.REDUCE])
    root = rng.choice([-1, rng.randrange(8)])
    receivers = tuple(rng.sample(range(8), rng.choice([0, 0, 1, 2, 3])))
    return Task(kind, 0, ((0, 4),), root, receivers, 16, step=step)


def _tasks(rng: random.Random) -> tuple[Task, ...]:
    n = rng.randint(1, 6)
    steps = rng.choice([[0], [2], [0, 1], [1 << 40, 3]])
    return tuple(_task(rng, rng.choice(steps)) for _ in range(n))


def _same_gate(a: StepGate, b: StepGate) -> None:
    assert a.need.tolist() == b.need.tolist()
    assert a.member_dev.tolist() == b.member_dev.tolist()
    assert a.member_task.tolist() == b.member_task.tolist()
    assert a.start().tolist() == b.start().tolist()


@pytest.mark.parametrize("seed", range(6))
def test_the_choice_is_the_rule_task_by_task(seed):
    rng = random.Random(seed)
    kinds = set()
    for _ in range(400):
        tasks = _tasks(rng)
        got = gate_of(tasks)
        assert type(got) is _old_choice(tasks)
        kinds.add(type(got))
        if isinstance(got, StepGate):
            _same_gate(got, StepGate(tasks))
    assert kinds == {OneStep, StepGate}
    assert type(gate_of(())) is StepGate


def test_a_task_of_a_root_alone_has_a_device_and_a_copy_of_none_none():
    root_only = Task(TaskKind.REDUCE, 0, ((0, 4),), 3, (), 16)
    sends = Task(TaskKind.BROADCAST, 0, ((0, 4),), 0, (1,), 16)
    assert isinstance(gate_of((sends, root_only)), OneStep)
    bare_copy = Task(TaskKind.COPY, 0, ((0, 4),), 3, (), 16)
    assert isinstance(gate_of((sends, bare_copy)), StepGate)
    assert isinstance(gate_of((sends, sends.at_step(1))), StepGate)


def test_a_full_gate_given_its_steps_is_the_one_that_reads_them():
    rng = random.Random(11)
    tasks = tuple(_task(rng, rng.randrange(3)) for _ in range(50))
    step = np.array([t.step for t in tasks], dtype=np.int64)
    _same_gate(StepGate(tasks, step), StepGate(tasks))

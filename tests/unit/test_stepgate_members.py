"""``stepgate.task_members``: every task's distinct devices read from its receivers,
root and addends as arrays (no ``devices`` tuple per task), held to the tasks'
``devices`` as sets (the oracle): the same counts, each task's devices ascending, over
every kind of task (copies, whose root is no device of theirs; allgathers without a
root; broadcasts summing addends, some also receivers; tasks of no device), and the
same starts, end after end, as the step rule over the memberships of ``devices``."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.costing import stepgate
from reshard.planner.costing.stepgate import StepGate, task_members
from reshard.planner.values.tasks import Task, TaskKind


def _task(rng: random.Random, ndev: int) -> Task:
    """A random task of any kind (its devices may repeat: a root or an addend that is
    also a receiver)."""
    kind = rng.choice([TaskKind.SEND, TaskKind.BROADCAST, TaskKind.COPY,
                       TaskKind.ALLGATHER, TaskKind.REDUCE])
    picked = rng.sample(range(ndev), rng.randint(1, min(ndev, 12)))
    root = -1 if kind is TaskKind.ALLGATHER else picked[0]
    recv = tuple(picked[1:]) if kind is not TaskKind.COPY else tuple(picked[:1])
    if rng.random() < 0.1:
        recv = ()  # a task of no receiver (a copy of none has no device)
    if recv and rng.random() < 0.2:
        recv = (*recv, rng.choice([*recv, max(root, 0)]))  # a device named twice
    addends: tuple[int, ...] = ()
    if kind is TaskKind.BROADCAST and rng.random() < 0.4:
        addends = tuple(rng.sample(range(ndev), rng.randint(1, min(ndev, 3))))
    return Task(kind, 0, ((0, 4),), root, recv, 16, step=rng.randint(0, 3),
                addends=addends)


def _oracle(tasks: tuple[Task, ...]) -> tuple[list[int], list[list[int]]]:
    sets = [sorted(set(t.devices)) for t in tasks]
    return [len(s) for s in sets], sets


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("ndev", [2, 16, 1 << 20])  # a flag per key; a sort of the keys
def test_members_are_each_tasks_devices_as_a_set(seed, ndev):
    rng = random.Random(seed * 7 + ndev)
    tasks = tuple(_task(rng, min(ndev, 4096)) for _ in range(rng.choice([1, 5, 60, 700])))
    if ndev == 1 << 20:  # devices far apart: the keys' range far above their count
        tasks = tuple(Task(t.kind, 0, t.box, t.root * 251 if t.root >= 0 else -1,
                           tuple(d * 251 for d in t.receivers), 16, step=t.step,
                           addends=tuple(d * 251 for d in t.addends)) for t in tasks)
    need, member = task_members(tasks)
    want_need, want = _oracle(tasks)
    assert need.tolist() == want_need
    at = np.concatenate([[0], np.cumsum(need)])
    assert [member[at[i]:at[i + 1]].tolist() for i in range(len(tasks))] == want


def test_no_tasks_and_tasks_of_no_device():
    need, member = task_members(())
    assert need.tolist() == [] and member.tolist() == []
    nobody = Task(TaskKind.COPY, 0, ((0, 4),), 3, (), 16)  # a copy's root is no device
    need, member = task_members((nobody, nobody))
    assert need.tolist() == [0, 0] and member.tolist() == []
    summed = Task(TaskKind.BROADCAST, 0, ((0, 4),), 2, (5, 2), 16, addends=(7, 5))
    need, member = task_members((nobody, summed))
    assert need.tolist() == [0, 3] and member.tolist() == [2, 5, 7]
    # addends count only where devices name the root: not on a copy's (its receivers)
    copied = Task(TaskKind.COPY, 0, ((0, 4),), 3, (4,), 16, addends=(6,))
    need, member = task_members((copied, summed, copied))
    assert need.tolist() == [1, 3, 1] and member.tolist() == [4, 2, 5, 7, 4]
    assert [sorted(set(t.devices)) for t in (copied, summed)] == [[4], [2, 5, 7]]


@pytest.mark.parametrize("seed", range(6))
def test_gate_starts_as_over_the_devices_tuples(seed):
    """The step rule over these memberships starts the same tasks, end after end, as
    over each task's ``devices`` (:func:`stepgate.distinct_devices`)."""
    rng = random.Random(seed)
    tasks = tuple(t for t in (_task(rng, 24) for _ in range(300)) if t.devices)
    step = np.array([t.step for t in tasks], dtype=np.int64)
    fast = StepGate(tasks)
    slow = StepGate.of_members(*stepgate.distinct_devices([t.devices for t in tasks]), step)
    got, want = fast.start().tolist(), slow.start().tolist()
    assert got == want
    running = list(got)
    while running:
        rng.shuffle(running)
        done, running = np.array(sorted(running[:3])), running[3:]
        got, want = fast.ended(done).tolist(), slow.ended(done).tolist()
        assert got == want
        running += got

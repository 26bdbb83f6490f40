"""The step rule's events counted in a table or sorted, and its slots' tasks scanned
or indexed (issue 62, round twelve): an event that names many slots or tasks counts
them with ``np.bincount`` rather than sorting them, and one that enters a large share
of the memberships left scans them rather than indexing them by slot; the starts,
event after event, are the same every way."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.costing import stepgate
from reshard.planner.costing.stepgate import StepGate
from reshard.planner.values.tasks import Task, TaskKind


def _tasks(rng: random.Random, n: int, ndev: int, steps: int) -> tuple[Task, ...]:
    out = []
    for _ in range(n):
        picked = rng.sample(range(ndev), rng.randint(1, 12))
        addends = (picked[-1],) if len(picked) > 2 and rng.random() < 0.2 else ()
        out.append(Task(TaskKind.BROADCAST, 0, ((0, 4),), picked[0], tuple(picked[1:]), 16,
                        step=rng.randrange(steps), addends=addends))
    return tuple(out)


def _events(tasks: tuple[Task, ...], seed: int, big: bool) -> list[list[int]]:
    """Start, then end running tasks (all of them at once where ``big``, else a few at
    a time) until every task has ended; each event's starts."""
    rng = random.Random(seed)
    gate = StepGate(tasks)
    got = [gate.start().tolist()]
    running, ended = set(got[0]), 0
    while ended < len(tasks):
        assert running, "the gate stalled"
        pool = sorted(running)
        batch = pool if big else sorted(rng.sample(pool, min(len(pool), rng.randint(1, 3))))
        running -= set(batch)
        ended += len(batch)
        got.append(gate.ended(np.array(batch, dtype=np.int64)).tolist())
        running |= set(got[-1])
    return got


@pytest.mark.parametrize("big", [True, False])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_counted_and_sorted_events_start_the_same_tasks(seed, big, monkeypatch):
    tasks = _tasks(random.Random(seed), 400, 40 * seed, 2 + seed)
    default = _events(tasks, seed, big)
    monkeypatch.setattr(stepgate, "COUNTED_FROM", 1)  # sorted unless naming every one
    sorted_ = _events(tasks, seed, big)
    monkeypatch.setattr(stepgate, "COUNTED_FROM", 1 << 30)  # always counted
    counted = _events(tasks, seed, big)
    assert default == sorted_ == counted
    assert sum(map(len, default)) == len(tasks)


@pytest.mark.parametrize("big", [True, False])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_scanned_and_indexed_slots_start_the_same_tasks(seed, big, monkeypatch):
    tasks = _tasks(random.Random(seed + 10), 400, 40 * seed, 2 + seed)
    default = _events(tasks, seed, big)
    monkeypatch.setattr(stepgate, "SCANNED_FROM", 0)  # indexed from the first event
    indexed = _events(tasks, seed, big)
    monkeypatch.setattr(stepgate, "SCANNED_FROM", 1 << 30)  # scanned at every event
    scanned = _events(tasks, seed, big)
    monkeypatch.setattr(stepgate, "SCANNED_FROM", 1)  # scanned while one takes them all
    mixed = _events(tasks, seed, big)
    assert default == indexed == scanned == mixed
    assert sum(map(len, default)) == len(tasks)


def test_a_slot_index_lists_the_pending_memberships_by_slot():
    """SlotTasks: scanned twice (the memberships left shrinking each time), then
    indexed over those left; each event's tasks those of its slots' memberships (as a
    multiset)."""
    rng = random.Random(5)
    slot = np.array([rng.randrange(60) for _ in range(1000)], dtype=np.int64)
    task = np.sort(np.array([rng.randrange(90) for _ in range(1000)], dtype=np.int64))
    index = stepgate.SlotTasks(slot, task, 60)
    order = rng.sample(range(60), 60)
    events = [order[:40], order[40:55], order[55:56], order[56:]]
    for k, event in enumerate(events):
        got = index.of(np.array(sorted(event), dtype=np.int64))
        want = task[np.isin(slot, event)]
        assert sorted(got.tolist()) == sorted(want.tolist())
        if k < 2:  # scanned: the memberships left are those of the slots not entered
            assert index.index is None and index.pending is not None
            entered = [s for e in events[:k + 1] for s in e]
            assert index.pending.tolist() == np.flatnonzero(~np.isin(slot, entered)).tolist()
    assert index.index is not None  # the small events read an index

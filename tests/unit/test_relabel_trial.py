"""Large tasks whose forms never repeat are found by their own search (issue 62, round
nine): a :func:`cost.task_routes` call stops ranking a shape's tasks by form once its
first :data:`cost.RELABEL_TRIAL` tasks of that shape each had a form of its own (a
reduction over every device, to each device in turn); every route still equals the
task's own, bit for bit, and a shape whose forms repeat keeps its forms."""

from __future__ import annotations

import pytest

from reshard.planner.costing import cost, relabel_many
from reshard.planner.costing.cost import Hops, Routes, task_path, task_routes
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit._regular_clusters import regular_clusters

HOSTS, GPUS = 24, 8


def _spied(monkeypatch, batch: bool) -> list[bool]:
    """Per ``relabeled`` call, whether its form was in the memo already (``batch``: the
    call's large tasks found together, :func:`relabel_many.relabeled_many`, which calls
    none; else task by task)."""
    if not batch:
        monkeypatch.setattr(cost, "RELABEL_BATCH", 1 << 30)
    met: list[bool] = []
    real = relabel_many.relabeled

    def spy(*args):
        before = len(args[4])  # the memo of forms
        got = real(*args)
        met.append(len(args[4]) == before)
        return got

    monkeypatch.setattr(relabel_many, "relabeled", spy)
    return met


def _check(tasks: list[Task], cluster) -> int:
    """Check each route is the task's own; the forms found (by host: not counting the
    place forms, :mod:`~reshard.planner.costing.place_forms`)."""
    known = Routes()
    for _ in range(2):  # found, then read back
        for t, (path, lat) in zip(tasks, task_routes(tasks, cluster, known)):
            want, want_lat = task_path(t, cluster, Hops())
            assert lat == want_lat  # the same float
            assert list(path) == list(want)
    assert known.hops is not None
    return sum(1 for f in known.hops.forms() if f[0] == "hosts")


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("name", list(regular_clusters(HOSTS, GPUS)))
def test_forms_of_their_own_give_way_to_each_task_s_search(name, batch, monkeypatch):
    cluster = regular_clusters(HOSTS, GPUS)[name]
    met = _spied(monkeypatch, batch)
    every = range(HOSTS * GPUS)
    tasks = [Task(TaskKind.REDUCE, 0, ((0, 8),), r, tuple(d for d in every if d != r),
                  3 << 20, 0) for r in every]
    assert _check(tasks, cluster) == cost.RELABEL_TRIAL  # then each its own search
    assert met == ([] if batch else [False] * cost.RELABEL_TRIAL)


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("name", list(regular_clusters(HOSTS, GPUS)))
def test_forms_that_repeat_are_kept(name, batch, monkeypatch):
    cluster = regular_clusters(HOSTS, GPUS)[name]
    met = _spied(monkeypatch, batch)
    tasks = []
    for r in range(HOSTS * GPUS):  # each root to the next 60 devices on: a form a place
        tasks.append(Task(TaskKind.BROADCAST, 0, ((0, 8),), r,
                          tuple((r + j) % (HOSTS * GPUS) for j in range(1, 61)), 3 << 20, 0))
    assert _check(tasks, cluster) < len(tasks) // 2
    assert met == [] if batch else len(met) == len(tasks) and sum(met) > len(tasks) // 2

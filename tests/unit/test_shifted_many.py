"""Routes of many small tasks moved home together (issue 62, round seven): on a regular
cluster :func:`route_forms.shifted_many` finds the routes :func:`route_forms.shifted`
finds task by task (a task moved by whole hosts to its root's place in host 0, its
form's route moved back) for a whole plan at once; every route must equal the route
the task finds alone, bit for bit, for sends-like chains, trees, fused sums and
reductions, twins of one form whole hosts apart, with and without relay pieces, on one
and several NICs a host."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard import Cluster
from reshard.planner.costing import cost, route_forms
from reshard.planner.costing.cost import Hops, Routes, task_path, task_routes
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit._regular_clusters import regular_clusters

HOSTS, GPUS = 20, 8


def _clusters() -> dict[str, Cluster]:
    return regular_clusters(HOSTS, GPUS)


def _task(rng: random.Random) -> Task:
    kind = rng.choice([TaskKind.BROADCAST, TaskKind.BROADCAST, TaskKind.REDUCE])
    k = rng.choice([1, 3, 7])
    picked = rng.sample(range(HOSTS * GPUS), k + 1)
    root, receivers = picked[0], tuple(picked[1:])
    parents: tuple[int, ...] = ()
    addends: tuple[int, ...] = ()
    if kind is TaskKind.BROADCAST and rng.random() < 0.3:  # a tree
        parents = tuple(rng.choice((root, *receivers[:j])) for j in range(k))
    if kind is TaskKind.BROADCAST and rng.random() < 0.2:  # a fused sum's addends
        addends = tuple(rng.sample([d for d in range(HOSTS * GPUS) if d not in picked], 2))
    return Task(kind, 0, ((0, 8),), root, receivers, rng.choice([1000, 3 << 22]), 0,
                parents=parents, addends=addends)


def _moved(t: Task, rng: random.Random) -> Task:
    """``t`` with every device moved by as many whole hosts (a twin: its form)."""
    named = [d // GPUS for d in t.devices]
    hosts = rng.randint(-min(named), HOSTS - 1 - max(named))

    def move(ds: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(d + hosts * GPUS for d in ds)

    return dataclasses.replace(t, root=move((t.root,))[0], receivers=move(t.receivers),
                               parents=move(t.parents), addends=move(t.addends))


@pytest.mark.parametrize("name", list(_clusters()))
@pytest.mark.parametrize("seed", range(2))
def test_routes_moved_home_together_are_each_task_s_own(name, seed, monkeypatch):
    cluster = _clusters()[name]
    together = []
    real = route_forms.shifted_many

    def spy(*args):
        together.append(len(args[0]))
        return real(*args)

    monkeypatch.setattr(cost, "shifted_many", spy)
    rng = random.Random(seed)
    tasks = []
    while len({cost.route_key(t, 0, 0, False) for t in tasks}) < cost.SHIFT_BATCH + 50:
        t = _task(rng)
        tasks += [t] + [_moved(t, rng) for _ in range(rng.randint(0, 6))]
    rng.shuffle(tasks)
    known = Routes()
    got = task_routes(tasks, cluster, known)
    assert together and together[0] >= cost.SHIFT_BATCH  # found together
    assert len(known.hops.forms()) < len(tasks) // 2  # twins' forms found once
    for t, (path, lat) in zip(tasks, got):
        want, want_lat = task_path(t, cluster, Hops())
        assert lat == want_lat  # the same float
        assert list(path) == list(want)
    again = task_routes(tasks[::-1], cluster, Routes())  # other firsts of each form
    for (path, lat), (other, other_lat) in zip(got, again[::-1]):
        assert lat == other_lat and list(path) == list(other)


@pytest.mark.parametrize("seed", range(6))
def test_shapes_group_as_task_by_task(seed):
    """``shifted_many``'s groups by shape (read from the route keys by ``map``s, one
    group at once where every key has one shape) equal those built task by task from
    each task's roles and its key's tail: the same groups, places and order."""
    import random

    from reshard.planner.costing.cost import route_key
    from reshard.planner.costing.route_forms import _shapes
    from reshard.planner.values.tasks import Task, TaskKind

    rng = random.Random(seed)
    tasks = []
    for _ in range(rng.randint(0, 40)):
        kind = TaskKind.BROADCAST if seed % 2 or rng.random() < 0.5 else TaskKind.REDUCE
        many = 2 if seed % 3 == 0 else rng.randint(1, 3)
        tasks.append(Task(kind, 0, ((0, 4),), rng.randint(64, 70),
                          tuple(rng.sample(range(64), many)), 16))
    keys = [route_key(t, rng.choice([0, 4]) if seed > 3 else 0, 0, seed > 4 and
                      rng.random() < 0.3) for t in tasks]
    want: dict[tuple[object, ...], list[int]] = {}
    for i, (t, key) in enumerate(zip(tasks, keys, strict=True)):
        want.setdefault((key[0], len(t.receivers), len(t.parents), len(t.addends),
                         len(t.addend_parents), *key[6:]), []).append(i)
    got = _shapes(keys)
    assert list(got.items()) == list(want.items())

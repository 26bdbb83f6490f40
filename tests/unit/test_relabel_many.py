"""Large routes by form, many tasks at once (issue 62, round eleven): the rows
:class:`relabel_many.RankedRows` ranks together equal those ranked one row at a time,
and :func:`relabel_many.relabeled_many` finds the routes, forms, memo and trial counts
that :func:`relabel_many.relabeled_or_own` finds task by task, bit for bit: chains,
trees, fused sums, reductions, rows of several lengths and tails, hosts revisited, a
trial given up, and a device below 0 (left to the task-by-task path)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.costing import cost
from reshard.planner.costing.cost import Hops, Routes, task_path, task_routes
from reshard.planner.costing.fairshare import Path, path_arrays
from reshard.planner.costing.relabel_many import (
    BLOCK,
    RankedRows,
    relabeled_many,
    relabeled_or_own,
)
from reshard.planner.costing.route_keys import route_key
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit._regular_clusters import regular_clusters
from tests.unit.test_relabeled_routes import _old_form_row

HOSTS, GPUS = 24, 8


def _task(rng: random.Random, devices: int, hosts: int, k: int, base: int = 0) -> Task:
    """A broadcast or reduction of ``k`` receivers, host by host or not, a tree or a
    fused sum at times."""
    picked = [base + d for d in rng.sample(range(hosts * devices), k + 1)]
    if rng.random() < 0.5:
        picked.sort(key=lambda d: (d // devices, rng.random()))
    root, receivers = picked[0], tuple(picked[1:])
    kind = rng.choice([TaskKind.BROADCAST, TaskKind.BROADCAST, TaskKind.REDUCE])
    parents: tuple[int, ...] = ()
    addends: tuple[int, ...] = ()
    if kind is TaskKind.BROADCAST and rng.random() < 0.5:
        parents = tuple(rng.choice((root, *receivers[:j])) for j in range(k))
    if kind is TaskKind.BROADCAST and rng.random() < 0.3:
        addends = tuple(rng.sample([d for d in range(base, base + hosts * devices)
                                    if d not in picked], 3))
    return Task(kind, 0, ((0, 8),), root, receivers, rng.choice([1000, 3 << 22]), 0,
                parents=parents, addends=addends, addend_parents=(root,) * len(addends))


@pytest.mark.parametrize("seed", range(8))
def test_ranked_rows_equal_each_row_ranked_alone(seed):
    rng = random.Random(seed)
    devices = rng.choice([1, 4, 6, 8])
    base = rng.choice([0, 4096])
    k = rng.randint(2, 70)
    shape = rng.choice([(0, 0), (k, 0), (k, 2)])
    tasks = []
    for _ in range(rng.randint(1, 3 * BLOCK)):  # several blocks, the last part full
        t = _task(rng, devices, 30 + 150 // devices, k, base)
        if shape[0] and not t.parents:
            t = Task(TaskKind.BROADCAST, 0, ((0, 8),), t.root, t.receivers, 16,
                     parents=(t.root,) * k)
        tasks.append(Task(t.kind, 0, ((0, 8),), t.root, t.receivers, 16,
                          parents=t.parents if shape[0] else (),
                          addends=(base + 1, base + 7 * devices)[:shape[1]],
                          addend_parents=(t.root,) * shape[1]))
    rows = RankedRows.of(tasks, devices)
    assert rows is not None
    for j, t in enumerate(tasks):
        want_row, want_order, want_number = _old_form_row(t, devices)
        assert rows.row(j) == want_row
        number = rows.number(j).tolist()
        assert number[:len(want_number)] == want_number.tolist()
        assert set(number[len(want_number):]) <= {-1}
        start, n = int(rows.begin[j]), int(rows.counts[j])
        assert rows.order[start:start + n].tolist() == want_order.tolist()


def _routes(tasks, cluster, batch: bool):
    """Each task's route by form, all at once (``batch``) or task by task, and the
    memo of forms and trial counts they leave."""
    hops = Hops()
    hops.cluster = cluster
    step = hops.host_step(cluster)
    assert step is not None
    todo = {route_key(t, 0, 0, False): t for t in tasks}  # distinct keys, as task_routes
    keys, tasks = list(todo), list(todo.values())
    tried: dict = {}
    if batch:
        got = relabeled_many(tasks, keys, step, lambda t: _finder(t, cluster),
                             (hops.forms(), hops.ones()), tried)
    else:
        got = [relabeled_or_own(t, k, step, _finder(t, cluster),
                                (hops.forms(), hops.chains(), hops.ones()), tried)
               for t, k in zip(tasks, keys)]
    return tasks, got, hops.forms(), tried


def _finder(task, cluster):
    def find():
        path, lat = task_path(task, cluster, Hops())
        return (path if isinstance(path, Path) else Path(path)), lat
    return find


@pytest.mark.parametrize("name", list(regular_clusters(HOSTS, GPUS)))
@pytest.mark.parametrize("seed", range(4))
def test_many_at_once_equal_task_by_task(name, seed):
    cluster = regular_clusters(HOSTS, GPUS)[name]
    rng = random.Random(seed)
    tasks = []
    for _ in range(5):  # forms and their twins over renumbered hosts
        t = _task(rng, GPUS, HOSTS, rng.randint(cost.ARRAY_EDGES, 90))
        tasks.append(t)
        for _ in range(rng.randint(1, 4)):
            perm = list(range(HOSTS))
            rng.shuffle(perm)

            def move(ds, perm=perm):
                return tuple(perm[d // GPUS] * GPUS + d % GPUS for d in ds)

            tasks.append(Task(t.kind, 0, ((0, 8),), move((t.root,))[0], move(t.receivers),
                              t.nbytes, 0, parents=move(t.parents), addends=move(t.addends),
                              addend_parents=move(t.addend_parents)))
    rng.shuffle(tasks)
    one, one_routes, one_forms, one_tried = _routes(tasks, cluster, False)
    _, many_routes, many_forms, many_tried = _routes(tasks, cluster, True)
    assert many_tried == one_tried and list(many_forms) == list(one_forms)
    for t, (a, lat_a), (b, lat_b) in zip(one, one_routes, many_routes):
        want, want_lat = task_path(t, cluster, Hops())
        assert lat_a == lat_b == want_lat  # the same float
        assert path_arrays(a)[0].tolist() == path_arrays(b)[0].tolist()
        assert list(b) == list(want)
    for f in one_forms:
        for x, y in zip(one_forms[f][:2], many_forms[f][:2]):
            assert np.array_equal(x, y)


@pytest.mark.parametrize("name", list(regular_clusters(HOSTS, GPUS)))
def test_rows_of_one_length_split_otherwise_between_roles(name):
    """Chains of 112 receivers, trees of 56 receivers and 56 parents, fused sums of 56
    receivers and 56 addends: rows of one length, found apart."""
    cluster = regular_clusters(HOSTS, GPUS)[name]
    rng = random.Random(11)
    tasks = []
    for j in range(24):
        picked = rng.sample(range(HOSTS * GPUS), 113)
        picked.sort(key=lambda d: (d // GPUS, rng.random()))
        root, rest = picked[0], tuple(picked[1:])
        if j % 3 == 0:
            tasks.append(Task(TaskKind.BROADCAST, 0, ((0, 8),), root, rest, 16, 0))
        elif j % 3 == 1:
            tasks.append(Task(TaskKind.BROADCAST, 0, ((0, 8),), root, rest[:56], 16, 0,
                              parents=(root,) * 56))
        else:
            tasks.append(Task(TaskKind.BROADCAST, 0, ((0, 8),), root, rest[:56], 16, 0,
                              addends=rest[56:], addend_parents=(root,) * 56))
    _, many_routes, _, _ = _routes(tasks, cluster, True)
    for t, (path, lat) in zip(tasks, many_routes):
        want, want_lat = task_path(t, cluster, Hops())
        assert lat == want_lat and list(path) == list(want)


def test_numbered_back_codes_are_read_only():
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    rng = random.Random(3)
    t = _task(rng, GPUS, 10, 60)
    twin = Task(t.kind, 0, ((0, 8),), t.root + 10 * GPUS,
                tuple(d + 10 * GPUS for d in t.receivers), t.nbytes, 0,
                parents=tuple(d + 10 * GPUS for d in t.parents),
                addends=tuple(d + 10 * GPUS for d in t.addends),
                addend_parents=tuple(d + 10 * GPUS for d in t.addend_parents))
    _, routes, forms, _ = _routes([t, twin], cluster, True)
    assert len(forms) == 1
    codes = path_arrays(routes[1][0])[0]
    with pytest.raises(ValueError):
        codes[0] = 0


def test_a_device_below_0_is_left_task_by_task():
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    tasks = [Task(TaskKind.BROADCAST, 0, ((0, 8),), r, tuple(d for d in range(60) if d != r),
                  16, 0, parents=(-1,) + (r,) * 58) for r in range(20)]
    hops = Hops()
    hops.cluster = cluster
    step = hops.host_step(cluster)
    keys = [route_key(t, 0, 0, False) for t in tasks]
    assert relabeled_many(tasks, keys, step, lambda t: _finder(t, cluster),
                          (hops.forms(), hops.ones()), {}) is None
    assert not hops.forms()
    known = Routes()
    plain = [Task(t.kind, 0, ((0, 8),), t.root, t.receivers, 16, 0,
                  parents=(t.root,) * 59) for t in tasks]
    for t, (path, lat) in zip(plain, task_routes(plain, cluster, known)):
        want, want_lat = task_path(t, cluster, Hops())
        assert lat == want_lat and list(path) == list(want)

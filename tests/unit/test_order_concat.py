"""OrderKeys.concat's shortcut (one part with rows: that part itself) against the
concatenation it replaces, and OrderKeys.of_tasks (the fields read in one pass)
against the task-by-task reads it replaces: the same columns, the same order."""

from __future__ import annotations

import dataclasses

import numpy as np

from reshard.planner.schedule import order
from reshard.planner.schedule.device_arrays import device_arrays
from reshard.planner.values.tasks import Buffer, Task, TaskKind
from tests.unit._regular_clusters import regular_clusters


def _keys(rng, n, width):
    return order.OrderKeys(
        rng.integers(0, 3, n), rng.integers(0, 3, n), rng.integers(0, 8, n),
        rng.choice([8, 1 << 20, 1 << 33], n), rng.integers(0, 2, n),
        rng.integers(0, 1 << 16, (n, width)), rng.integers(-1, 2048, n), rng.permutation(n))


def _concatenated(parts):
    width = max(p.box.shape[1] for p in parts)
    cols = {f.name: np.concatenate([getattr(p, f.name) for p in parts])
            for f in dataclasses.fields(order.OrderKeys) if f.name != "box"}
    box = np.concatenate([np.pad(p.box, ((0, 0), (0, width - p.box.shape[1])))
                          for p in parts])
    return order.OrderKeys(box=box, **cols)


def _same(a, b):
    for f in dataclasses.fields(order.OrderKeys):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert x.dtype == y.dtype and np.array_equal(x, y)
    assert np.array_equal(a.order(), b.order())


def test_concat_of_one_part_with_rows_is_that_part():
    rng = np.random.default_rng(3)
    keys = _keys(rng, 300, 4)
    empty = _keys(rng, 0, 0)
    for parts in ([empty, keys], [keys, empty], [keys]):
        got = order.OrderKeys.concat(parts)
        assert got is keys
        _same(got, _concatenated(parts))
    wider = _keys(rng, 0, 6)  # an empty part with wider boxes: padded, a new object
    got = order.OrderKeys.concat([wider, keys])
    assert got is not keys and got.box.shape[1] == 6
    _same(got, _concatenated([wider, keys]))
    _same(order.OrderKeys.concat([keys, keys]), _concatenated([keys, keys]))


def _boxes_one_by_one(tasks):
    width = 2 * max((len(t.box) for t in tasks), default=0)
    box = np.zeros((len(tasks), width), dtype=np.int64)
    for i, t in enumerate(tasks):
        flat = [v for pair in t.box for v in pair]
        box[i, :len(flat)] = flat
    return box


def _of_tasks_one_by_one(tasks, seq, cluster):
    """OrderKeys.of_tasks as it read each field task by task (the reference)."""
    nh = max(1, cluster.num_hosts)
    host = cluster.host_map
    return order.OrderKeys(
        np.array([t.step for t in tasks], dtype=np.int64).reshape(-1),
        np.array([order.PHASE[t.kind] for t in tasks], dtype=np.int64).reshape(-1),
        np.array([(host[t.receivers[0]] - host[t.root]) % nh
                  if t.root >= 0 and t.kind is not TaskKind.COPY else 0 for t in tasks],
                 dtype=np.int64).reshape(-1),
        np.array([t.nbytes for t in tasks], dtype=np.int64).reshape(-1),
        np.array([t.tensor for t in tasks], dtype=np.int64).reshape(-1),
        _boxes_one_by_one(tasks),
        np.array([t.root for t in tasks], dtype=np.int64).reshape(-1),
        np.asarray(seq, dtype=np.int64))


def test_of_tasks_is_the_task_by_task_reads():
    cluster = regular_clusters(6, 8)["preset"]
    rng = np.random.default_rng(5)
    tasks = []
    for k in range(400):
        kind = [TaskKind.SEND, TaskKind.BROADCAST, TaskKind.COPY, TaskKind.ALLGATHER,
                TaskKind.REDUCE][k % 5]
        devs = [int(d) for d in rng.choice(48, 4, replace=False)]
        root = -1 if kind is TaskKind.ALLGATHER else devs[0]
        receivers = (devs[0],) if kind is TaskKind.COPY else tuple(devs[1:1 + k % 3 + 1])
        box = tuple((i, i + 1 + k % 4) for i in range(1 + k % 3))  # 1 to 3 dims
        tasks.append(Task(kind, k % 3, box, root, receivers, 8 * (1 + k % 7), k % 4,
                          source=Buffer.SRC))
    seq = rng.permutation(len(tasks))
    two_dims = [t for t in tasks if len(t.box) == 2]  # every box of two dims: read flat
    scalars = [Task(TaskKind.SEND, 0, (), 1, (9,), 2)] * 3  # of none
    host = device_arrays(cluster, 0)[0]
    allreduce = [Task(TaskKind.ALLREDUCE, 0, ((0, 8),), -1, (3, 40), 64, 0),
                 Task(TaskKind.COPY, 1, ((0, 8),), 41, (41,), 64, 1), tasks[1],
                 # a copy read as one (distance 0) even with another device listed
                 dataclasses.replace(tasks[2], receivers=((tasks[2].root + 8) % 48,))]
    for some in (tasks, two_dims, scalars, tasks[:1], [], allreduce,
                 [t for t in tasks if t.kind is not TaskKind.COPY]):
        want = _of_tasks_one_by_one(some, seq[:len(some)], cluster)
        _same(order.OrderKeys.of_tasks(some, seq[:len(some)], cluster), want)
        # the distances from the host array: the same columns
        _same(order.OrderKeys.of_tasks(some, seq[:len(some)], cluster, host), want)


def test_of_tasks_by_host_array_reads_a_receiverless_task_one_by_one():
    """A task without receivers (root -1: distance 0) makes the bulk distances decline;
    the keys are the task-by-task reads still."""
    cluster = regular_clusters(2, 8)["preset"]
    tasks = [Task(TaskKind.SEND, 0, ((0, 4),), 1, (9,), 8),
             Task(TaskKind.ALLGATHER, 0, ((0, 4),), -1, (), 8, 1)]
    got = order.OrderKeys.of_tasks(tasks, np.arange(2), cluster, device_arrays(cluster, 0)[0])
    _same(got, _of_tasks_one_by_one(tasks, np.arange(2), cluster))

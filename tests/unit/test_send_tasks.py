"""send_columns.send_tasks (sends built empty, each slot set on all of them in C) against
the dataclass's constructor, field by field, and OrderedTasks.tasks (the objects alone
taken in order where no send is a column) against placing every task by its position."""

from __future__ import annotations

import dataclasses
from itertools import repeat

import numpy as np
import pytest

from reshard.planner.schedule.send_columns import OrderedTasks, SendColumns, send_tasks
from reshard.planner.values.tasks import Buffer, Task, TaskKind


def _built(tensor, boxes, root, recv, nbytes, step):
    return list(map(Task, repeat(TaskKind.SEND), tensor, boxes, root,
                    [(d,) for d in recv], nbytes, step))


def _same_tasks(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert type(a) is Task and a == b and hash(a) == hash(b)
        for f in dataclasses.fields(Task):
            x, y = getattr(a, f.name), getattr(b, f.name)
            assert x == y and type(x) is type(y), f.name


def _columns(rng, n, width):
    ndim = rng.integers(0, width + 1, n)
    lo = rng.integers(0, 1 << 20, (n, width))
    hi = lo + rng.integers(1, 1 << 10, (n, width))
    box = np.zeros((n, 2 * width), dtype=np.int64)
    for j in range(width):
        box[:, 2 * j] = np.where(j < ndim, lo[:, j], 0)
        box[:, 2 * j + 1] = np.where(j < ndim, hi[:, j], 0)
    return SendColumns(np.arange(n, dtype=np.int64), rng.integers(0, 3, n),
                       rng.integers(0, 64, n), rng.integers(0, 8, n),
                       rng.choice([1, 1024, 1 << 40], n), rng.integers(0, 4, n), box, ndim)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 300])
@pytest.mark.parametrize("width", [0, 1, 3])
def test_send_tasks_are_the_constructors(n, width):
    rng = np.random.default_rng(n * 10 + width)
    cols = _columns(rng, n, width)
    rows = rng.permutation(n).astype(np.int64)
    args = (cols.tensor[rows].tolist(), cols.boxes(rows), cols.root[rows].tolist(),
            cols.recv[rows].tolist(), cols.nbytes[rows].tolist(), cols.step[rows].tolist())
    got = send_tasks(*args)
    _same_tasks(got, _built(*args))
    _same_tasks(cols.tasks(rows), got)
    for t in got:  # defaults, and one receiver tuple per device
        assert t.source is Buffer.SRC and t.kind is TaskKind.SEND and t.pieces == ()
    by_device = {}
    for t in got:
        assert by_device.setdefault(t.receivers[0], t.receivers) is t.receivers


def _placed(ordered):
    out = [None] * len(ordered)
    cols = ordered.send_columns
    for pos, t in zip(ordered.positions, ordered.objects):
        out[pos] = t
    for pos, t in zip(cols.position.tolist(), cols.tasks(np.arange(len(cols.position)))):
        out[pos] = t
    assert None not in out
    return tuple(out)


@pytest.mark.parametrize("sends", [0, 1, 50])
@pytest.mark.parametrize("objects", [0, 1, 40])
def test_ordered_tasks_as_placed(sends, objects):
    rng = np.random.default_rng(sends + 100 * objects)
    n = sends + objects
    at = np.sort(rng.permutation(n)[:sends]).astype(np.int64)
    cols = _columns(rng, sends, 2)
    cols = dataclasses.replace(cols, position=at)
    own = sorted(set(range(n)) - set(at.tolist()))
    objs = [Task(TaskKind.BROADCAST, 0, ((i, i + 1),), i % 5, (7, 8), 1, i) for i in own]
    ordered = OrderedTasks(objs, own, cols)
    got = ordered.tasks()
    assert isinstance(got, tuple)
    _same_tasks(list(got), list(_placed(ordered)))

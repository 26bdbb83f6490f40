"""Form rows kept as bytes (issue 62, round eighteen): :class:`relabel_many.RankedRows`
keeps each row's form row as bytes, rows equal to one kept before as that very object
(found by a weighted sum, told apart by the bytes where sums meet), no block's array
kept. The rows equal those ranked one row at a time (``test_relabel_many``); here:
equal rows are one object, rows whose sums meet stay apart, and the form row read as
an array is the bytes read back (read only)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.costing.relabel_many import BLOCK, ROW_STRIDE, RankedRows
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit.test_relabeled_routes import _old_form_row


def _tasks(rng: random.Random, devices: int, forms: int, count: int) -> list[Task]:
    """``count`` broadcasts of 40 receivers over 64 hosts, each of one of ``forms``
    layouts (hosts in one order, each moved to other hosts): rows of few forms."""
    layouts = []
    for _ in range(forms):
        hosts = rng.randint(3, 9)
        layouts.append([(rng.randrange(hosts), rng.randrange(devices)) for _ in range(41)])
    out = []
    for _ in range(count):
        layout = rng.choice(layouts)
        where = rng.sample(range(64), 9)  # the layout's hosts placed on these
        picked = [where[h] * devices + d for h, d in layout]
        out.append(Task(TaskKind.BROADCAST, 0, ((0, 8),), picked[0], tuple(picked[1:]), 16))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_equal_form_rows_are_one_object_and_each_rows_own(seed):
    rng = random.Random(seed)
    devices = rng.choice([1, 4, 8])
    tasks = _tasks(rng, devices, rng.randint(1, 5), rng.randint(BLOCK, 4 * BLOCK))
    rows = RankedRows.of(tasks, devices)
    assert rows is not None
    by_bytes: dict[bytes, bytes] = {}
    for j, t in enumerate(tasks):
        want = _old_form_row(t, devices)[0]
        got = rows.row(j)
        assert got == want
        assert by_bytes.setdefault(got, got) is got  # equal rows: one object
        formed = rows.formed_row(j)
        assert formed.tobytes() == want and not formed.flags.writeable
    assert len(by_bytes) == sum(map(len, rows.distinct.values()))


def test_rows_whose_sums_meet_are_kept_apart():
    rows = RankedRows()
    width = 2 * ROW_STRIDE + 1  # the sample: places 0, ROW_STRIDE, 2 * ROW_STRIDE
    a, b, c = (np.zeros(width, dtype=np.int64) for _ in range(3))
    b[1] = 5  # outside the sample: b's sum is a's
    c[ROW_STRIDE] = 1  # inside it: c's sum is 2
    block = np.stack((a, b, a, b, c))
    rows._kept(block)
    assert [np.frombuffer(r, dtype=np.int64).tolist() for r in rows.rows] == block.tolist()
    assert rows.rows[0] is rows.rows[2] and rows.rows[1] is rows.rows[3]
    assert rows.rows[0] is not rows.rows[1]
    assert len(rows.distinct) == 2 and len(rows.distinct[0]) == 2


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("uniform", [True, False])
def test_numbered_back_is_base_plus_hosts_by_span(seed, uniform):
    """Codes numbered back, one span for every code (the hosts scaled first) or not:
    ``base + order[ranked] * span``, row by row."""
    rng = random.Random(seed)
    devices = rng.choice([1, 4, 8])
    tasks = _tasks(rng, devices, 1, rng.randint(BLOCK, 3 * BLOCK))  # one layout
    rows = RankedRows.of(tasks, devices)
    assert rows is not None
    named = int(rows.counts[0])
    n = rng.randint(1, 90)
    ranked = np.array([rng.randrange(named) for _ in range(n)], dtype=np.int64)
    span = np.full(n, 64, dtype=np.int64) if uniform else \
        np.array([rng.choice([8, 64, 100]) for _ in range(n)], dtype=np.int64)
    if not uniform:
        span[0] = 8
        span[-1] = 100  # (never all one)
    base = np.array([rng.randrange(64) for _ in range(n)], dtype=np.int64)
    which = sorted(rng.sample(range(len(tasks)), rng.randint(1, len(tasks))))
    got = rows.numbered_back(which, (base, np.stack((ranked, span)), 0.5), {})
    for j, (path, lat) in zip(which, got):
        start = int(rows.begin[j])
        order = rows.order[start:start + named]
        assert path.arrays[0].tolist() == (base + order[ranked] * span).tolist()
        assert lat == 0.5

"""Form rows kept as bytes (issue 62, round eighteen): :class:`relabel_many.RankedRows`
keeps each row's form row as bytes (:class:`shared_rows.SharedRows`), rows equal to one kept
before as that very object (found by a sampled weighted sum and compared as arrays, told
apart by the bytes where sums meet), no block's array kept. The rows equal those ranked one row at a time (``test_relabel_many``); here:
equal rows are one object, rows whose sums meet stay apart, and the form row read as
an array is the bytes read back (read only)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.costing.shared_rows import ROW_STRIDE, SharedRows
from reshard.planner.costing.relabel_many import BLOCK, RankedRows
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
    assert len(by_bytes) == len(rows.kept.kept)


def _added(*blocks: np.ndarray) -> SharedRows:
    kept = SharedRows(blocks[0].shape[1])
    for block in blocks:
        kept.add(block, np.full_like(block, -7))
    return kept


def test_rows_whose_sums_meet_are_kept_apart():
    width = 2 * ROW_STRIDE + 1  # the sample: places 0, ROW_STRIDE, 2 * ROW_STRIDE
    a, b, c = (np.zeros(width, dtype=np.int64) for _ in range(3))
    b[1] = 5  # outside the sample: b's sum is a's
    c[ROW_STRIDE] = 1  # inside it: c's sum is another
    for blocks in ([np.stack((a, b, a, b, c))], [np.stack((a, c)), np.stack((b, a, b, c))],
                   [np.stack((b,)), np.stack((a, a)), np.stack((c, b, a))]):
        kept = _added(*blocks)
        rows = np.concatenate(blocks)
        assert [np.frombuffer(r, dtype=np.int64).tolist() for r in kept.rows] == \
            rows.tolist()
        first: dict[bytes, bytes] = {}
        for r in kept.rows:
            assert first.setdefault(r, r) is r  # equal rows: one object
        assert len(kept.kept) == 3 and len(kept.by_sum) == 2


@pytest.mark.parametrize("seed", range(10))
def test_rows_added_block_by_block_are_their_own_bytes(seed):
    """Many blocks of rows drawn from a few (some differing only outside the sample,
    the table grown several times): each row's own bytes, equal ones one object."""
    rng = np.random.default_rng(seed)
    width = int(rng.integers(1, 40))
    pool = rng.integers(0, 3, size=(int(rng.integers(1, 40)), width))
    if width > 1:
        pool[1::2, 1] = pool[::2, 1][:len(pool[1::2])] + 1  # off the sample: sums meet
    blocks = [pool[rng.integers(0, len(pool), size=int(rng.integers(1, BLOCK + 1)))]
              for _ in range(int(rng.integers(1, 12)))]
    kept = _added(*blocks)
    rows = np.concatenate(blocks)
    assert [r == row.tobytes() for r, row in zip(kept.rows, rows)] == [True] * len(rows)
    first: dict[bytes, bytes] = {}
    for r in kept.rows:
        assert first.setdefault(r, r) is r
    assert len(kept.kept) == len(first)


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

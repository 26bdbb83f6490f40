"""A tree's latest reach summed a depth at a time over its edges sorted by depth
(``costing/tree_reach.by_levels``, issue 62 round ten): the same float as the loop over
the edges in order, bit for bit, on random trees (shallow and deep, with and without
relay fills, senders reached only later or never, a device reached twice), and None
exactly where the loop must answer (reached twice, deeper than asked)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.costing import cost
from reshard.planner.costing.tree_reach import _depths, by_levels
from tests.unit._reach_loop import reach_loop


def _tree(rng: random.Random, n: int, fan: int, late: bool):
    """A random tree of ``n`` edges: each receiver fed by one of the last ``fan``
    devices reached (1: a chain), or (``late``) a few senders reached only later or
    never."""
    devices = rng.sample(range(5 * n), n + 1)
    root, rest = devices[0], devices[1:]
    a, b, reached = [], [], [root]
    for d in rest:
        a.append(rng.choice(reached[-fan:]))
        b.append(d)
        reached.append(d)
    if late:
        for i in rng.sample(range(2, n), 3):
            a[i] = rng.choice([rest[-1], rest[-2], 5 * n + 1])  # later, or never
    return a, b


def _depth_loop(a, b):
    by = {r: i for i, r in enumerate(b)}
    depth = []
    for i, s in enumerate(a):
        j = by.get(s, len(a))
        depth.append(depth[j] + 1 if j < i else 0)
    return depth


@pytest.mark.parametrize("seed", range(12))
def test_by_levels_is_the_loop_s_float(seed):
    rng = random.Random(seed)
    n = rng.choice([60, 300, 1024])
    fan = rng.choice([1, 2, 8, 64, n])
    a, b = _tree(rng, n, fan, late=seed % 3 == 0)
    waits = [2e-6, 3.3e-6, 1.1e-5, 0.1 + 0.2]
    wait = [rng.choice(waits) for _ in a]
    fill = [rng.random() * 1e-4 for _ in a] if seed % 2 else None
    arrays = [np.array(a), np.array(b), np.array(wait)]
    fills = None if fill is None else np.array(fill)
    size = 5 * n + 2
    depth = _depth_loop(a, b)
    assert _depths(*_up(arrays[0], arrays[1], size)).tolist() == depth
    want = reach_loop(a, b, wait, fill)
    for deepest in (n, max(depth), max(depth) - 1, n // 32):
        got = by_levels(*arrays, fills, size, deepest)
        if max(depth) > deepest:
            assert got is None
        else:
            assert got == want  # the same float
    assert cost._reach(*arrays, fills) == want


def _up(a, b, size):
    n = len(a)
    by = np.full(size, n, dtype=np.int64)
    by[b] = np.arange(n)
    up = by[a]
    early = up < np.arange(n)
    return np.where(early, up, 0), early, np.arange(n)


@pytest.mark.parametrize("seed", range(4))
def test_a_device_reached_twice_is_left_to_the_loop(seed):
    rng = random.Random(seed)
    a, b = _tree(rng, 200, 4, late=False)
    a.append(b[-1])
    b.append(b[10])  # reached again
    arrays = [np.array(x) for x in (a, b, [1e-6] * len(a))]
    assert by_levels(*arrays, None, 1001, len(a)) is None
    assert cost._reach(*arrays, None) == reach_loop(a, b, [1e-6] * len(a), None)

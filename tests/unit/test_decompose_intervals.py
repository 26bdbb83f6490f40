"""Cells' intervals (planner/cells/decompose.py): the pieces covering each interval
between cut points, found per piece, equal those found by testing every piece against
every interval."""

from __future__ import annotations

import itertools
import random

from reshard.planner.cells.decompose import _intervals


def _cover(d, lo, hi, boxes):
    return sum(1 << i for i, (b, _) in enumerate(boxes) if b[d][0] <= lo and hi <= b[d][1])


def _brute(d, size, src, dst):
    cuts = sorted({0, size, *(p for b, _ in src + dst for p in b[d])})
    return [((lo, hi), _cover(d, lo, hi, src), _cover(d, lo, hi, dst))
            for lo, hi in itertools.pairwise(cuts) if _cover(d, lo, hi, dst)]


def _pieces(rng, size, n):
    out = []
    for _ in range(n):
        box = []
        for s in size:
            if rng.random() < 0.3:
                box.append((0, s))  # spans the dim
            else:
                a, b = sorted(rng.sample(range(s + 1), 2))
                box.append((a, b))
        out.append((tuple(box), frozenset({rng.randrange(64)})))
    return out


def test_interval_masks_equal_every_piece_tested_against_every_interval():
    rng = random.Random(62)
    for _ in range(300):
        size = (rng.randint(1, 40), rng.randint(1, 40))
        src, dst = _pieces(rng, size, rng.randint(1, 12)), _pieces(rng, size, rng.randint(1, 12))
        for d in range(2):
            assert _intervals(d, size[d], src, dst) == _brute(d, size[d], src, dst)


def test_cells_equal_the_numpy_tables_on_random_layouts():
    """decompose (interval masks, unions per distinct mask) against decompose_table,
    which finds the same cells with numpy column by column."""
    from reshard import DeviceMesh, Layout
    from reshard.planner.cells.decompose import decompose, decompose_table, devices_by_box

    rng = random.Random(5)
    specs = ["RR", "S0R", "RS0", "S1R", "RS1", "S0S1", "S1S0", "S01R", "RS10", "S10R"]
    for _ in range(60):
        shape = (rng.randint(1, 50), rng.randint(1, 50))
        m1 = rng.choice([(2, 4), (4, 2), (2, 2), (3, 2)])
        m2 = rng.choice([(2, 4), (4, 2), (2, 2), (3, 3)])
        src = Layout(DeviceMesh(m1, range(m1[0] * m1[1])), rng.choice(specs))
        dst = Layout(DeviceMesh(m2, range(50, 50 + m2[0] * m2[1])), rng.choice(specs))
        holders, needers = devices_by_box(src, shape), devices_by_box(dst, shape)
        assert decompose(shape, holders, needers) == \
            decompose_table(shape, holders, needers).cells()

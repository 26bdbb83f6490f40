"""expect_runs._expect_held (a run of cells sharing one set of several holders, its
expected NIC demand summed as whole bytes) against the cell-by-cell
``Loads.expect`` it replaces: the same expectations (floats), shared bytes and epoch,
or a decline that changes nothing."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard.planner.cells import balance, expect_runs
from reshard.planner.cells.decompose import Cell
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import assert_same_loads, load_tables, twin_loads

HOSTS, GPUS = 6, 8


def _clusters():
    got = regular_clusters(HOSTS, GPUS)
    got["shared"] = dataclasses.replace(got["pieces"], shared_bandwidth=5e10)
    return got


def _cells(rng, cluster, n, holders, shape, nbytes):
    """``n`` cells held by ``holders`` (fresh equal sets or the same object), their
    needers drawn by ``shape``."""
    devices = list(cluster.devices)
    away = [d for d in devices if d not in holders]
    cells, sizes = [], []
    for k in range(n):
        if shape == "one away":
            needers = {rng.choice(away)}
        elif shape == "many away":
            needers = set(rng.sample(away, rng.randint(2, min(20, len(away)))))
        elif shape == "overlap":
            needers = set(rng.sample(devices, rng.randint(1, 30)))
        else:  # "held": every needer holds it (no demand, shared 0)
            needers = set(rng.sample(sorted(holders), 2))
        own = holders if rng.random() < 0.5 else frozenset(set(holders))
        cells.append(Cell(((0, 1), (k, k + 1)), own, frozenset(needers)))
        sizes.append(rng.choice(nbytes))
    return cells, sizes


def _by_loop(loads, cells, nbytes):
    for cell, nb in zip(cells, nbytes):
        loads.expect(cell.holders, cell.needers - cell.holders, nb)


WHOLE = [0, 720720 * 16, 3 * 720720 * 16]  # every share over <= 16 NICs is whole
FRACTION = [720720 * 16, 1003]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics", "shared"])
@pytest.mark.parametrize("shape", ["one away", "many away", "overlap", "held"])
@pytest.mark.parametrize("size", [2, 9, 16])
def test_expect_held_is_expect_in_turn(seed, variant, shape, size):
    rng = random.Random(seed)
    cluster = _clusters()[variant]
    a, b = twin_loads(rng, cluster, crowded=seed % 2 == 1)
    holders = frozenset(rng.sample(list(cluster.devices), size))
    cells, nbytes = _cells(rng, cluster, 600, holders, shape, WHOLE)
    _by_loop(a, cells, nbytes)
    before = repr(load_tables(b)), b.shared, b._epoch
    took = expect_runs.expect_run(b, cells, nbytes)
    assert took or seed % 2 == 1  # crowded: expectations of fractions may decline it
    if not took:
        assert (repr(load_tables(b)), b.shared, b._epoch) == before
        _by_loop(b, cells, nbytes)
    assert_same_loads(a, b, expected_order=False)


def _declined(b, cells, nbytes):
    before = repr(load_tables(b)), b.shared, b._epoch
    assert not expect_runs.expect_run(b, cells, nbytes)
    assert (repr(load_tables(b)), b.shared, b._epoch) == before  # nothing changed


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("spoil", ["fraction", "entry fraction", "other holders", "one holder",
                                   "start"])
def test_expect_held_declines_and_changes_nothing(seed, spoil):
    rng = random.Random(seed)
    cluster = _clusters()["shared"]
    a, b = twin_loads(rng, cluster, crowded=False)
    # 7 NICs on two hosts (1003 / 7 is no whole number), needers on the other four
    holders = frozenset(rng.sample(list(cluster.devices)[:16], 7))
    cells, nbytes = _cells(rng, cluster, 600, holders, "one away",
                           FRACTION if spoil == "fraction" else WHOLE)
    if spoil == "fraction":
        nbytes[rng.randrange(600)] = 1003
    k = rng.randrange(1, 600)
    c = cells[k]
    if spoil == "other holders":
        cells[k] = Cell(c.box, c.holders | {c.box[1][0] % 48}, c.needers)
        if cells[k].holders == holders:
            cells[k] = Cell(c.box, c.holders - {min(holders)}, c.needers)
    elif spoil == "one holder":
        cells[0] = Cell(c.box, frozenset({min(holders)}), c.needers)
    elif spoil == "entry fraction":  # 7168 / 7 leaves whole, 7168 / 3 enters not
        cells[k] = Cell(c.box, c.holders, frozenset({24, 25, 26}))
        nbytes[k] = 7168
    elif spoil == "start":  # an expectation that is not whole before the run
        for loads in (a, b):
            for n in {loads.nic(d) for d in holders}:
                loads.expected[(balance.NIC_OUT, n)] += 0.5
    _declined(b, cells, nbytes)
    _by_loop(a, cells, nbytes)
    _by_loop(b, cells, nbytes)
    assert_same_loads(a, b, expected_order=True)


def test_expect_held_takes_a_replicated_source():
    """The 1,024-device case in small: every device of two hosts holds each cell, each
    cell to one device of another host (a NIC_OUT amount onto every holder's NIC)."""
    cluster = _clusters()["pieces"]
    holders = frozenset(range(16))
    cells = [Cell(((k, k + 1), (0, 4)), holders, frozenset({16 + k % 32})) for k in range(640)]
    nbytes = [1 << 16] * 640
    a, b = balance.Loads(cluster), balance.Loads(cluster)
    _by_loop(a, cells, nbytes)
    assert expect_runs.expect_run(b, cells, nbytes)
    assert_same_loads(a, b, expected_order=False)
    assert b.expected[(balance.NIC_OUT, 0)] == 640 * (1 << 16) / 16

"""The array forms of a run's per-cell work (planner/cells/set_codes.py,
expect_runs._kinds_bulk, broadcast_runs._charge_roots) against the cell-by-cell loops
they replace: the same answers and loads (floats and key order), and a fall back (not a
wrong answer) wherever they do not apply."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.cells import broadcast_runs, expect_runs
from reshard.planner.cells.decompose import Cell
from reshard.planner.cells.set_codes import first_order, set_codes
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import expect_cells, load_tables, twin_loads

HOSTS, GPUS = 6, 8


def test_set_codes_number_values_in_first_order():
    rng = random.Random(0)
    values = [frozenset(rng.sample(range(9), rng.randint(1, 3))) for _ in range(12)]
    sets = [frozenset(set(rng.choice(values))) for _ in range(300)]  # distinct objects
    sets += [rng.choice(sets) for _ in range(300)]  # and shared ones
    codes, distinct = set_codes(sets)
    want: dict[frozenset[int], int] = {}
    assert codes.tolist() == [want.setdefault(s, len(want)) for s in sets]
    assert distinct == list(want)
    got, first = first_order(np.array([5, 3, 5, 9, 3, 1]))
    assert got.tolist() == [0, 1, 0, 2, 1, 3] and first.tolist() == [0, 1, 3, 5]


def _spoiled_cells(rng, cluster, n, fresh, spoil):
    """:func:`expect_cells`, one of them ``spoil``-ed (none where ``spoil`` is "")."""
    cells, nbytes = expect_cells(rng, cluster, n, fresh=fresh)
    devices = list(cluster.devices)
    k = rng.randrange(n)
    c = cells[k]
    if spoil == "two holders":
        cells[k] = Cell(c.box, c.holders | {devices[0], devices[-1]}, c.needers)
    elif spoil == "one needer":
        cells[k] = Cell(c.box, c.holders, frozenset(list(c.needers)[:1]))
    elif spoil == "holder needs":
        cells[k] = Cell(c.box, c.holders, c.needers | c.holders)
    return cells, nbytes


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics"])
@pytest.mark.parametrize("spoil", ["", "two holders", "one needer", "holder needs"])
@pytest.mark.parametrize("fresh", [False, True])
def test_kinds_bulk_is_kinds(seed, variant, spoil, fresh):
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    a, b = twin_loads(rng, cluster, False)
    cells, nbytes = _spoiled_cells(rng, cluster, 300, fresh, spoil)
    want = expect_runs._kinds(a, cells, nbytes)
    got = expect_runs._kinds_bulk(b, cells, nbytes)
    if spoil:
        assert want is None and got is None
        return
    assert want is not None and got is not None
    assert got[0] == want[0]
    assert got[1].tolist() == want[1].tolist() and got[2].tolist() == want[2].tolist()
    assert load_tables(a) == load_tables(b)


def _charge_by_loop(loads, roots, nbytes):
    for root, nb in zip(roots, nbytes):
        loads.dev_out[root] += nb
        loads.nic_out[loads.nic(root)] += nb


@pytest.mark.parametrize("start", ["whole", "fraction", "near 2**53", "nan"])
@pytest.mark.parametrize("seed", range(3))
def test_charge_roots_is_the_loop_or_declines(start, seed):
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)["pieces"]
    a, b = twin_loads(rng, cluster, False)
    devices = list(cluster.devices)
    roots = [rng.choice(devices[:20]) for _ in range(700)]
    nbytes = [rng.choice([0, 8192, 3 * 8192, 7]) for _ in roots]
    for loads in (a, b):  # most keys new: charged in the order first seen
        loads.nic_out.clear()
    for d in rng.sample(devices[:20], 6):  # loads before the run (others: new keys)
        value = {"whole": 4096.0, "fraction": 4096.3, "near 2**53": 2.0 ** 53 - 9000,
                 "nan": float("nan")}[start]
        for loads in (a, b):
            loads.dev_out[d] = loads.nic_out[loads.nic(d)] = value
    _charge_by_loop(a, roots, nbytes)
    before = load_tables(b)
    done = broadcast_runs._charge_roots(b, roots, nbytes)
    assert done == (start == "whole")
    if not done:
        assert repr(load_tables(b)) == repr(before)  # nothing changed (nan != nan)
        _charge_by_loop(b, roots, nbytes)
    for x, y in zip(load_tables(a), load_tables(b)):
        assert list(x) == list(y)  # keys in the same order
        assert repr(list(x.values())) == repr(list(y.values()))

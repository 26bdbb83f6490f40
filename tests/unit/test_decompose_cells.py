"""decompose_cells (decompose_pieces' grid of many pieces, built with numpy) against
decompose, the path it replaces: the same cells in the same order."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard import DeviceMesh, Layout
from reshard.planner.cells import decompose as dec
from reshard.planner.cells.decompose import decompose, decompose_cells, devices_by_box
from tests.unit.test_decompose_fast import _random_boxes


@pytest.mark.parametrize("seed", range(4))
def test_decompose_cells_is_decompose(seed, monkeypatch):
    monkeypatch.setattr(dec, "CELLS_FROM", 1)  # the numpy grid for every problem
    rng = random.Random(seed)
    merged = 0
    for _ in range(150):
        ndim = rng.randint(0, 3)
        shape = tuple(rng.randint(1, 12) for _ in range(ndim))
        holders = _random_boxes(rng, shape, rng.randint(0, 5), list(range(8)))
        needers = _random_boxes(rng, shape, rng.randint(0, 5), list(range(8, 16)))
        want = decompose(shape, holders, needers)
        got = decompose_cells(shape, holders, needers)
        assert got == want
        assert [c.size for c in got] == [c.size for c in want]
        merged += len(got) < len(dec._table(shape, holders, needers)[0])
    assert merged  # some grids merge cells (the merge branch is checked)
    box = {((0, 4), (0, 0)): frozenset({1})}
    assert decompose_cells((4, 0), box, box) == decompose((4, 0), box, box) == []


@pytest.mark.parametrize("src, dst", [("S0R", "RS1"), ("RS1", "S0S1"), ("S01R", "RS0")])
def test_decompose_cells_of_layouts_is_decompose(src, dst, monkeypatch):
    shape = (96, 64)
    a = Layout(DeviceMesh((4, 4)), src)
    b = Layout(DeviceMesh((4, 4), devices=range(16, 32)), dst)
    holders, needers = devices_by_box(a, shape), devices_by_box(b, shape)
    want = decompose(shape, holders, needers)
    monkeypatch.setattr(dec, "CELLS_FROM", 1)
    monkeypatch.setattr(dec, "decompose", None)  # the numpy grid, not the cell loop
    assert decompose_cells(shape, holders, needers) == want


def test_cells_of_a_table_too_large_for_its_size_column_count_exactly():
    """CellTable.cells reads ``size`` from the column only where no product of extents
    can overflow int64; beyond, each size is the exact product (as new_cell's)."""
    lo = np.zeros((2, 2), dtype=np.int64)
    hi = np.array([[2 ** 40, 2 ** 30], [3, 5]], dtype=np.int64)
    table = dec.CellTable(lo, hi, np.prod(hi - lo, axis=1), np.zeros(2, np.int64),
                          np.zeros(2, np.int64), (frozenset({0}),), (frozenset({1}),))
    assert [c.size for c in table.cells()] == [2 ** 70, 15]
    small = dec.CellTable(lo, hi // 2 ** 20, np.prod(hi // 2 ** 20 - lo, axis=1),
                          np.zeros(2, np.int64), np.zeros(2, np.int64),
                          (frozenset({0}),), (frozenset({1}),))
    assert [(c.size, type(c.size)) for c in small.cells()] == [(2 ** 30, int), (0, int)]

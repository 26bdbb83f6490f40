"""A merged kind of rows alone summed straight from its rows
(:func:`~reshard.planner.schedule.row_sums.row_items`, issue 62 round sixteen): the
same items, in the same order, and the same :class:`Inexact` as the merged way (its
exact chunks summed by ``floors._Kind``), on random rows and on the floors of partial
sources; and every baseline floor the same float with the rows' path turned off."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.cuts import cut_slices
from reshard.planner.schedule import floors
from reshard.planner.schedule.floors import _counted, _Kind, baseline_floor
from reshard.planner.schedule.merged_sums import Inexact, MergedKind
from reshard.planner.schedule.row_sums import row_items
from reshard.planner.values.strategy import Strategy

from .test_held_allgather_floor import H100, SMALL, _tensors


def _kind(rows, arrays=()):
    kind = MergedKind()
    for a in arrays:
        kind.add(*a)
    for row in rows:
        kind.one(row)
    return kind


def _merged(rows, arrays=()):
    """The merged way's items, or Inexact."""
    try:
        return _Kind(_kind(rows, arrays).exact_chunks()).items()
    except Inexact:
        return Inexact


def _rows_way(rows, arrays=(), up_to=4096):
    try:
        return row_items(_kind(rows, arrays), up_to)
    except Inexact:
        return Inexact


def _random_rows(rng: random.Random, n: int, values: list) -> list:
    return [(rng.randrange(12), rng.randrange(4), rng.choice(values)) for _ in range(n)]


VALUES = {
    "ints": [1, 7, 4096, 1 << 20, 3 << 30],
    "whole floats": [1.0, 65536.0, 2.5e9, float(1 << 40)],
    "mixed": [3, 1.0, 12288, 4.0e6],
    "negative": [-5, 7, -1 << 20],
    "half": [1, 0.5, 3],  # not whole: Inexact
    "third": [1 << 20, (1 << 20) / 3],
    "near 2**53": [(1 << 52) - 1, 1 << 51],  # some kinds reach 2**53: Inexact
    "inf": [1, float("inf")],
    "nan": [2, float("nan")],
}


@pytest.mark.parametrize("name", sorted(VALUES))
@pytest.mark.parametrize("n", [1, 2, 37, 900])
def test_the_merged_ways_items_or_its_inexact(name, n):
    rng = random.Random(hash((name, n)) & 0xFFFF)
    for _ in range(5):
        rows = _random_rows(rng, n, VALUES[name])
        want, got = _merged(rows), _rows_way(rows)
        assert got is want if want is Inexact else got is not Inexact
        if want is not Inexact:
            assert got == want  # the same keys in the same order, the same floats
            assert all(type(b) is float for _, b in got)


def test_no_rows_gives_no_items():
    assert _rows_way([]) == [] == _merged([])


def test_exactly_at_the_limit_of_whole_sums():
    # magnitudes summing to 2**53 - 1 stay exact; 2**53 does not (nor its negative)
    below = [(0, 0, (1 << 52)), (1, 0, (1 << 52) - 1)]
    at = [(0, 0, (1 << 52)), (1, 0, 1 << 52)]
    mixed = [(0, 0, -(1 << 52)), (0, 0, 1 << 52)]
    assert _rows_way(below) == _merged(below) != Inexact
    assert _rows_way(at) is Inexact is _merged(at)
    assert _rows_way(mixed) is Inexact is _merged(mixed)


def test_left_to_the_merged_way():
    rows = [(1, 0, 8), (2, 1, 8)]
    index, step = np.array([3, 4]), np.array([0, 0])
    assert _rows_way(rows, [(index, step, np.array([1.0, 2.0]))]) is None  # arrays
    empty = np.zeros(0, dtype=np.int64)
    assert _rows_way(rows, [(empty, empty, np.zeros(0))]) == _merged(rows)  # adds none
    assert _rows_way(rows, up_to=1) is None  # too many rows
    assert _rows_way(rows, up_to=2) == _merged(rows)
    assert _rows_way([(1, 0, np.int64(8))]) is None  # a numpy number
    assert _rows_way([(1, 0, True)]) is None


PARTIAL = [("RS1+P0", "S0R", (8192, 8192), "cross"), ("RR+P01", "RS0", (2048, 2048), "cross"),
           ("S0R+P1", "RR", (16384, 4096), "cross"), ("RR+P0", "S1R", (1000, 3000), "cross"),
           ("S1R+P0", "RS01", (999, 4097), "overlap"), ("RS0+P1", "S0S1", (2048, 2050), "same"),
           ("RR+P1", "RR", (4096, 4096), "overlap")]
"""Partial sources (their reduced pieces' cells of a few receivers are counted row by
row), with uneven shapes and overlapping or the same meshes."""


@pytest.mark.parametrize("src,dst,shape,how", PARTIAL)
@pytest.mark.parametrize("strategy", [Strategy.SEND_RECV, Strategy.ALLGATHER])
@pytest.mark.parametrize("cluster", [H100, SMALL], ids=["h100", "small"])
def test_a_floors_kinds_as_merged(src, dst, shape, how, strategy, cluster):
    dims = (4, 8) if cluster is H100 else (2, 3)
    tensors = _tensors(src, dst, shape, how, cluster, dims)
    s = cut_slices(tensors, cluster, strategy)
    flows = _counted(s.work, s.itemsizes, cluster, strategy, True)
    for part in (flows.dev_out, flows.dev_in, flows.nic_out, flows.nic_in):
        arrays = [(c[0], c[1], v) for c in part.chunks for v, _ in c[2].values()]
        got = _rows_way(list(part.rows), arrays)  # a copy: the kind is read once
        if got is not None:
            assert got == _merged(list(part.rows), arrays)


def test_the_cold_sets_partial_send_floor_takes_the_rows_path():
    # RS1+P0 -> S0R (8192 x 8192): 512 reduced pieces, each sent to 8 receivers, 4,096
    # rows a kind and no arrays: each kind summed from its rows
    tensors = _tensors("RS1+P0", "S0R", (8192, 8192), "cross")
    s = cut_slices(tensors, H100, Strategy.SEND_RECV)
    flows = _counted(s.work, s.itemsizes, H100, Strategy.SEND_RECV, True)
    for part in (flows.dev_out, flows.dev_in, flows.nic_out, flows.nic_in):
        assert len(part.rows) == 4096
        assert row_items(part, floors.DICT_SUM_UP_TO) is not None


@pytest.mark.parametrize("src,dst,shape,how", PARTIAL)
@pytest.mark.parametrize("strategy", [Strategy.SEND_RECV, Strategy.ALLGATHER])
@pytest.mark.parametrize("cluster", [H100, SMALL], ids=["h100", "small"])
def test_every_floor_the_same_float_without_the_rows_path(src, dst, shape, how, strategy,
                                                           cluster, monkeypatch):
    dims = (4, 8) if cluster is H100 else (2, 3)
    tensors = _tensors(src, dst, shape, how, cluster, dims)
    s = cut_slices(tensors, cluster, strategy)
    fast = baseline_floor(s.work, s.reduces, s.itemsizes, cluster, strategy)
    monkeypatch.setattr(floors, "row_items", lambda kind, up_to: None)
    slow = baseline_floor(s.work, s.reduces, s.itemsizes, cluster, strategy)
    assert fast == slow and type(fast) is type(slow)

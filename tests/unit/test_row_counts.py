"""A merged kind's rows summed by distinct row
(:func:`~reshard.planner.schedule.row_sums.row_items` counting each distinct row once,
issue 62 round seventeen): the same items, keys in the same order and the same floats,
as the rows added one by one (:func:`~reshard.planner.schedule.row_sums.summed`), on
rows that repeat heavily (a partial source's floor: each send once per cell), values of
mixed types, negative values and zeros; the same :class:`Inexact` where a value is not
whole or the magnitudes reach 2**53 (one row counted many times included); and on the
floors of partial sources."""

from __future__ import annotations

import random

import pytest

from reshard.planner.cuts import cut_slices
from reshard.planner.schedule.floors import _counted, _Kind
from reshard.planner.schedule.merged_sums import Inexact, MergedKind
from reshard.planner.schedule.row_sums import row_items, summed
from reshard.planner.values.strategy import Strategy

from .test_held_allgather_floor import H100, SMALL, _tensors


def _items(rows, up_to=1 << 20):
    kind = MergedKind()
    for row in rows:
        kind.one(row)
    try:
        return row_items(kind, up_to)
    except Inexact:
        return Inexact


def _bits(items):
    return [(key, b.hex()) for key, b in items]


VALUES = [[4096], [1, 3, 7], [2.0, 5, 1 << 30], [-4, 9, 0, -0.0], [0.0, -0.0],
          [float(1 << 40), 3, 12288.0]]


@pytest.mark.parametrize("values", VALUES, ids=range(len(VALUES)))
@pytest.mark.parametrize("keys,n", [(3, 50), (40, 900), (400, 900), (6, 5000)])
def test_the_rows_one_by_one(values, keys, n):
    rng = random.Random(hash((tuple(values), keys, n)) & 0xFFFF)
    for _ in range(4):
        pool = [(rng.randrange(keys), rng.randrange(3), rng.choice(values))
                for _ in range(max(1, keys // 2))]
        rows = [rng.choice(pool) for _ in range(n)]
        got = _items(rows)
        assert got is not Inexact
        assert _bits(got) == _bits(summed(rows))  # the same keys, order and bits


def test_a_row_repeated_past_2_53_is_inexact():
    row = (1, 0, float(1 << 43))
    assert _items([row] * 1023) is not Inexact
    assert _items([row] * 1024) is Inexact  # 1024 * 2**43 = 2**53
    rest = (1 << 43) - 1  # with 1023 rows and one more byte: 2**53
    assert _items([(0, 0, 1)] + [row] * 1023 + [(2, 0, rest - 1)]) is not Inexact
    assert _items([(0, 0, 1)] + [row] * 1023 + [(2, 0, rest)]) is Inexact
    assert _items([(0, 0, -1)] + [row] * 1023 + [(2, 0, rest)]) is Inexact  # magnitudes


@pytest.mark.parametrize("bad", [0.5, float("inf"), float("nan"), (1 << 20) / 3])
def test_a_value_not_whole_is_inexact(bad):
    assert _items([(0, 0, 4)] * 30 + [(1, 0, bad)] + [(0, 0, 4)] * 3) is Inexact


@pytest.mark.parametrize("src,dst,shape,how", [
    ("RR+P0", "RS0", (16384, 4096), "cross"), ("S0R+P1", "RS0", (8192, 8192), "cross"),
    ("RS1+P0", "RR", (999, 4097), "overlap"), ("RR+P01", "RR", (1030, 777), "same")])
@pytest.mark.parametrize("cluster", [H100, SMALL], ids=["h100", "small"])
@pytest.mark.parametrize("strategy", [Strategy.SEND_RECV, Strategy.ALLGATHER])
def test_a_partial_sources_floor_rows(src, dst, shape, how, cluster, strategy):
    dims = (4, 8) if cluster is H100 else (2, 3)
    s = cut_slices(_tensors(src, dst, shape, how, cluster, dims), cluster, strategy)
    flows = _counted(s.work, s.itemsizes, cluster, strategy, True)
    repeated = 0
    for name in ("dev_out", "dev_in", "nic_out", "nic_in"):
        kind = getattr(flows, name)
        assert not any(len(index) for index, _, _ in kind.chunks)  # rows alone
        rows = list(kind.rows)
        got = _items(rows)
        if got is Inexact:  # the merged way's too (shares of a piece not whole)
            with pytest.raises(Inexact):
                _Kind(kind.exact_chunks()).items()
            continue
        assert _bits(got) == _bits(summed(rows)) == _bits(_Kind(kind.exact_chunks()).items())
        repeated += len(rows) - len(set(rows))
    assert repeated  # rows repeat: counted once each

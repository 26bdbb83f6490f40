"""packed_sort.lexsort's sort on the leading keys alone (packed_sort._sorted_below:
they span at most SMALL values, the other keys already never decrease row by row)
against numpy.lexsort: tables in row-major order sorted by a rotation distance (the
1,024-device all-to-all's keys), the other keys in order with ties, one row out of
order, leading spans at and past SMALL, constant keys between, and random keys."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.planner.schedule import packed_sort

N = packed_sort.PACK_FROM + 321


def _table_keys(rng, n, lead_span, tie):
    """An all-to-all's order keys (the last the primary): row-major boxes, a leading
    distance of ``lead_span`` values, constants between."""
    side = int(np.ceil(np.sqrt(n)))
    lo0 = np.repeat(np.arange(side) * 8, side)[:n]
    lo1 = np.tile(np.arange(side) * 16, side)[:n]
    if tie:
        lo1 = lo1 // 32 * 32  # neighbouring rows of equal boxes: the seq orders them
    seq = np.arange(n) + 7
    root = np.arange(n) // 3  # the same root for neighbouring rows
    dist = rng.integers(0, lead_span, n)
    dist[:2] = lead_span - 1, 0  # spanning every value
    const = np.full(n, 3)
    return [a.astype(np.int64) for a in (seq, root, lo1 + 16, lo1, lo0 + 8, lo0, const,
                                         -const, dist, const, np.zeros(n))]


@pytest.mark.parametrize("span,tie", [(255, False), (255, True), (1 << 16, False),
                                      ((1 << 16) + 1, False), (2, True), (40000, True)])
def test_leading_keys_alone_where_the_rest_is_in_order(span, tie):
    keys = _table_keys(np.random.default_rng(span), N, span, tie)
    got = packed_sort.lexsort(keys)
    assert np.array_equal(got, np.lexsort(keys))
    lead = packed_sort._sorted_below(keys, [(int(k.min()), int(k.max())) for k in keys])
    assert (lead is not None) == (span <= packed_sort.SMALL)


@pytest.mark.parametrize("where", [1, N // 2, N - 1])
def test_one_row_out_of_order_is_not_sorted_on_the_leading_keys(where):
    keys = _table_keys(np.random.default_rng(where), N, 255, False)
    keys[5] = keys[5].copy()
    keys[5][where] = keys[5][where - 1] - 8  # lo0 below the row before: out of order
    bounds = [(int(k.min()), int(k.max())) for k in keys]
    assert packed_sort._sorted_below(keys, bounds) is None
    assert np.array_equal(packed_sort.lexsort(keys), np.lexsort(keys))


def test_a_lower_key_out_of_order_under_equal_upper_ones():
    keys = _table_keys(np.random.default_rng(3), N, 100, True)
    keys[0] = keys[0].copy()
    i = int(np.flatnonzero((keys[2][1:] == keys[2][:-1]) & (keys[4][1:] == keys[4][:-1]))[0])
    keys[0][i], keys[0][i + 1] = keys[0][i + 1], keys[0][i]  # seq down where boxes tie
    bounds = [(int(k.min()), int(k.max())) for k in keys]
    assert packed_sort._sorted_below(keys, bounds) is None
    assert np.array_equal(packed_sort.lexsort(keys), np.lexsort(keys))


@pytest.mark.parametrize("seed", range(6))
def test_random_keys_and_every_key_leading(seed):
    rng = np.random.default_rng(seed)
    keys = [rng.integers(0, [3, 50, 1 << 40, 7][seed % 4], N).astype(np.int64)
            for _ in range(1 + seed % 3)]
    if seed % 2:
        keys = [np.sort(keys[0]), *keys[1:]][::-1]  # the lowest key in order
    assert np.array_equal(packed_sort.lexsort(keys), np.lexsort(keys))
    small = [rng.integers(0, 16, N).astype(np.int64) for _ in range(4)]  # all lead
    assert np.array_equal(packed_sort.lexsort(small), np.lexsort(small))


@pytest.mark.parametrize("down_under_tie", [False, True])
def test_the_other_keys_over_two_words(down_under_tie):
    """The other keys span two words: the lower word may fall where the upper one
    rises (still in order), not where it ties."""
    rng = np.random.default_rng(5)
    upper = np.sort(rng.integers(0, 1 << 40, N)) >> 32 << 32  # ties and rises
    upper[:2] = 0  # a tie at the first rows
    lower = rng.integers(0, 1 << 40, N)  # falls often, where the upper one rises, and
    # never where it ties:
    rises = np.flatnonzero(upper[1:] > upper[:-1])
    ties = np.flatnonzero(upper[1:] == upper[:-1])
    assert len(rises) > 100 and len(ties) > 100
    for i in ties.tolist():
        lower[i + 1] = max(lower[i + 1], lower[i])
    if down_under_tie:
        i = int(ties[len(ties) // 2])
        lower[i + 1] = lower[i] - 1
    lead = rng.integers(0, 300, N)
    keys = [a.astype(np.int64) for a in (lower, upper, lead)]
    bounds = [(int(k.min()), int(k.max())) for k in keys]
    assert len(list(packed_sort._words(keys[:2], bounds[:2]))) == 2
    assert (packed_sort._sorted_below(keys, bounds) is None) == down_under_tie
    assert np.array_equal(packed_sort.lexsort(keys), np.lexsort(keys))

"""packed_sort.lexsort (keys packed into words, the later words only where the first
ties) against numpy.lexsort, the sort it replaces: the same indices on keys of one
value, ties in the first word, negative keys, keys too wide to pack and many words."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.planner.schedule import packed_sort

N = packed_sort.PACK_FROM + 123


def _same(keys):
    got = packed_sort.lexsort(keys)
    assert np.array_equal(got, np.lexsort(keys))


@pytest.mark.parametrize("seed", range(6))
def test_random_keys_of_few_values_tie_in_the_first_word(seed):
    rng = np.random.default_rng(seed)
    keys = [rng.integers(-3, 4, N) for _ in range(5)]  # many ties: the later words read
    keys.append(np.full(N, 7, dtype=np.int64))  # one value: left out
    _same(keys)
    _same(keys[::-1])


@pytest.mark.parametrize("seed", range(4))
def test_distinct_first_words_and_many_words(seed):
    rng = np.random.default_rng(10 + seed)
    seq = rng.permutation(N).astype(np.int64)
    wide = [rng.integers(0, 1 << 40, N) for _ in range(4)]  # one word each, or about
    _same([seq, *wide])  # the primary word distinct: the first sort alone
    _same([*wide, seq])  # ties nowhere, seq the primary
    blocks = [rng.integers(0, 2, N), rng.integers(-(1 << 30), 1 << 30, N),
              rng.integers(0, 1 << 20, N)]
    _same([seq, *blocks])  # the primary word ties: every word read


def test_keys_too_wide_to_pack_and_small_or_odd_inputs():
    rng = np.random.default_rng(5)
    huge = np.where(rng.integers(0, 2, N) > 0, np.iinfo(np.int64).max,
                    np.iinfo(np.int64).min).astype(np.int64)
    _same([rng.integers(0, 5, N), huge])  # the span alone is more than a word: numpy's
    _same([np.zeros(N, np.int64), np.ones(N, np.int64)])  # every key of one value
    small = [rng.integers(0, 3, 50) for _ in range(3)]  # below PACK_FROM: numpy's
    _same(small)
    _same([rng.integers(0, 3, N).astype(np.int32), rng.integers(0, 3, N)])  # not int64
    edge = np.array([0, (1 << 62) - 1] * (N // 2), dtype=np.int64)  # about a word alone
    _same([rng.integers(0, 3, len(edge)), edge, rng.integers(0, 9, len(edge))])

"""packed_sort's words packed in place (issue 62, round eighteen): each later key is
added to its word as it is and its least value then taken off (int64 arithmetic wraps,
so the word is the same), instead of its digits laid out as a new array per key. Held
to the digits' words and to numpy.lexsort, on keys far from 0 (the sums wrap past
2**63 before the least value comes off) and negative ones."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from reshard.planner.schedule import packed_sort

N = packed_sort.PACK_FROM + 77


def _digit_words(keys, bounds):
    """The words as before: each key's offsets from its least value laid out, then
    packed (Python ints: no wrap at all)."""
    words, word, room = [], None, 1
    for key, (least, most) in zip(reversed(keys), reversed(bounds)):
        if least == most:
            continue
        radix = most - least + 1
        digit = [int(v) - least for v in key.tolist()]
        if word is not None and room * radix < packed_sort.WORD:
            word = [w * radix + d for w, d in zip(word, digit)]
            room *= radix
            continue
        if word is not None:
            words.append(word)
        word, room = digit, radix
    if word is not None:
        words.append(word)
    return words


def _keys(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    big = (1 << 62) + (1 << 61)
    return [rng.integers(big, big + 3, N), rng.integers(-(1 << 62), -(1 << 62) + 5, N),
            rng.integers(big, big + (1 << 20), N), np.full(N, 9, dtype=np.int64),
            rng.integers(0, 4, N), rng.integers(-7, 7, N)]


@pytest.mark.parametrize("seed", range(5))
def test_words_packed_in_place_are_the_digits_words(seed):
    keys = _keys(seed)
    bounds = [(int(k.min()), int(k.max())) for k in keys]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning: array arithmetic wraps
        got = [w.tolist() for w in packed_sort._words(keys, bounds)]
    assert got == _digit_words(keys, bounds)
    assert len(got) < len(keys) - 1  # keys shared words: the in-place adds ran


@pytest.mark.parametrize("seed", range(5))
def test_lexsort_of_keys_far_from_zero(seed):
    keys = _keys(seed)
    for order in (keys, keys[::-1], keys[1:] + keys[:1]):
        assert np.array_equal(packed_sort.lexsort(order), np.lexsort(order))

"""Resource numbers (first_seen): first places found block by block, and numbers
written over the caller's codes, the same as a first-appearance oracle."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.planner.costing import first_seen
from reshard.planner.costing.first_seen import numbered


def _oracle(codes: np.ndarray) -> tuple[list[int], list[int]]:
    """The distinct codes in the order they first appear, and each code's number."""
    order: dict[int, int] = {}
    for c in codes.tolist():
        order.setdefault(c, len(order))
    return list(order), [order[c] for c in codes.tolist()]


def _codes(seed: int, n: int, bound: int, dtype: type) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = rng.integers(0, bound, n).astype(dtype)
    if n > 10 and seed % 2:  # some codes first met late: past the prefix
        out[-5:] = bound + np.arange(5) * 7
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n,bound", [(0, 1), (7, 3), (1000, 50), (3000, 90000),
                                     (first_seen.BLOCK * 2 + 17, 700),
                                     (first_seen.BLOCK + 5, 4 * first_seen.BLOCK)])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_numbered_as_the_oracle_and_int32(seed, n, bound, dtype):
    codes = _codes(seed, n, bound, dtype)
    want_order, want_number = _oracle(codes)
    for reuse in (False, True):
        given = codes.copy()
        in_order, number = numbered(given, reuse)
        assert in_order.tolist() == want_order and number.tolist() == want_number
        assert number.dtype == np.int64  # intp: bincount reads it without a copy
        if not reuse:
            assert given.tolist() == codes.tolist()  # the caller's codes untouched


@pytest.mark.parametrize("seed", range(4))
def test_numbered_all_blocks_as_one_pass(seed):
    # the table path over more than a block: each code's first place is its least
    n = 3 * first_seen.BLOCK + 11
    codes = np.random.default_rng(seed).integers(0, 2000, n)
    codes[first_seen.BLOCK + 3] = 2001  # first met in the second block only
    codes[-1] = 2002  # in the last (short) block
    in_order, number = first_seen._numbered_all(codes, 2003)
    want_order, want_number = _oracle(codes)
    assert in_order.tolist() == want_order and number.tolist() == want_number


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("late", [0, 3, 40])
def test_numbered_in_place_as_the_oracle(seed, late):
    # many int64 codes over a small range, ``late`` of them first met after the prefix
    n = 2 * first_seen.BLOCK + 101
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 3000, n)
    codes[rng.integers(4 * 3100, n, late)] = 3000 + rng.integers(0, 100, late)
    want_order, want_number = _oracle(codes)
    given = codes.copy()
    in_order, number = numbered(given, True)
    assert in_order.tolist() == want_order and number.tolist() == want_number
    assert np.shares_memory(number, given)  # written over the codes given
    ro = codes.copy()
    ro.flags.writeable = False  # read only: a new array
    in_order, number = numbered(ro, True)
    assert number.tolist() == want_number and ro.tolist() == codes.tolist()
    narrow = codes.astype(np.int32)  # not intp: a new array
    in_order, number = numbered(narrow, True)
    assert number.tolist() == want_number and not np.shares_memory(number, narrow)

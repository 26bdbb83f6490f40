"""Resource numbers and joined codes in narrow types (first_seen, path_join): the same
values as the oracles they replace (a first-appearance numbering by ``np.unique`` and
``np.concatenate``), int32 where they fit, blocks of them found as one pass would."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.planner.costing import first_seen, path_join
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
    in_order, number = numbered(codes)
    want_order, want_number = _oracle(codes)
    assert in_order.tolist() == want_order and number.tolist() == want_number
    assert number.dtype == np.int64  # intp: bincount reads it without a copy


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


def _arrays(seed: int, lens: list[int], top: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, top, n) for n in lens]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("lens", [
    [3, 0, 5],  # few codes: joined as they are
    [path_join.NARROW // 3] * 7 + [0, 1],  # several blocks, an empty array
    [path_join.NARROW * 2 + 1, 5, path_join.NARROW - 1, 0],  # arrays over a block
    [1] * 1000 + [path_join.NARROW],
])
def test_narrow_joined_as_concatenate(seed, lens):
    arrays = _arrays(seed, lens, 16380)
    got = path_join.narrow_joined(arrays, np.array(lens, dtype=np.int64))
    want = np.concatenate(arrays)
    assert got.tolist() == want.tolist()
    assert got.dtype == (np.int32 if sum(lens) >= path_join.NARROW else np.int64)


@pytest.mark.parametrize("where", [0, -1, 4])
@pytest.mark.parametrize("wide", [1 << 31, -(1 << 31) - 1])
def test_narrow_joined_keeps_int64_for_wide_codes(where, wide):
    lens = [path_join.NARROW // 4] * 6
    arrays = _arrays(abs(where), lens, 1000)
    arrays[where][len(arrays[where]) // 2] = wide
    got = path_join.narrow_joined(arrays, np.array(lens, dtype=np.int64))
    assert got.dtype == np.int64 and got.tolist() == np.concatenate(arrays).tolist()


def test_narrow_joined_edges_of_int32_codes():
    # codes given as int32 join as they are (no check needed)
    lens = [path_join.NARROW, 3]
    arrays = [a.astype(np.int32) for a in _arrays(1, lens, 99)]
    got = path_join.narrow_joined(arrays, np.array(lens, dtype=np.int64))
    assert got.dtype == np.int32 and got.tolist() == np.concatenate(arrays).tolist()

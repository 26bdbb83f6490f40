"""The cost model's tables over bounded integers (issue 62, round four): the fair
shares' resources numbered in the order they first appear, and the step rule's slots,
found by a table over the values' range, are what the sorts of ``np.unique`` give, on
random values, repeats, empty inputs and ranges far larger than the values (where the
sort is kept)."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.planner.costing.first_seen import numbered as _numbered
from reshard.planner.costing.stepgate import _unique


def _inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        np.zeros(0, dtype=np.int64),
        np.array([5], dtype=np.int64),
        rng.integers(0, 50, 1000),  # many repeats
        rng.integers(0, 100_000, 300),  # a range far larger: the sort
        rng.permutation(5000).astype(np.int64),
        np.repeat(rng.integers(0, 8 * 1024, 400), rng.integers(1, 5, 400)),
    ]


@pytest.mark.parametrize("seed", range(4))
def test_resources_numbered_by_first_appearance_are_the_sort_s(seed):
    for codes in _inputs(seed):
        used, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
        order = np.argsort(first)
        number = np.empty(len(used), dtype=np.int64)
        number[order] = np.arange(len(used))
        in_order, res = _numbered(codes)
        assert in_order.tolist() == used[order].tolist()
        assert res.tolist() == number[inverse.reshape(-1)].tolist()
        assert res.dtype == np.int64


@pytest.mark.parametrize("seed", range(4))
def test_slots_by_a_table_are_np_unique_s(seed):
    for keys in _inputs(seed):
        want, inverse = np.unique(keys, return_inverse=True)
        got, slot = _unique(keys)
        assert got.tolist() == want.tolist()
        assert slot.tolist() == inverse.reshape(-1).tolist()

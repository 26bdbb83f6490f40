"""A floor's kind of many additions summed in arrays by key (floors._dense_sums, issue
62 round nine): every key in the order first added and its bytes summed in the order
added, as the sort of its keys and ``np.add.at`` over them gave, on bytes whose sums
depend on their order."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.planner.schedule import floors


def _old_items(kind: floors._Kind) -> list:
    """The arrays' path as it was: the keys by a sort (first places from it)."""
    kind._flush()
    index = np.concatenate([c[0] for c in kind.chunks])
    step = np.concatenate([c[1] for c in kind.chunks])
    nbytes = np.concatenate([c[2] for c in kind.chunks])
    span = int(index.max(initial=0)) + 1
    lo = int(step.min(initial=0))
    keys, first, at = np.unique((step - lo) * span + index, return_index=True,
                                return_inverse=True)
    total = np.zeros(len(keys))
    np.add.at(total, at.reshape(-1), nbytes)
    order = np.argsort(first, kind="stable")
    keys = keys[order]
    return list(zip(zip((keys % span).tolist(), (keys // span + lo).tolist()),
                    total[order].tolist()))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("spread", [300, 40_000])  # dense keys, and keys too sparse for it
def test_sums_by_key_in_arrays_are_the_sums_over_sorted_keys(seed, spread):
    rng = np.random.default_rng(seed)
    values = np.array([0.1, 1e17 / 3, 3.0, 12345.5, 2.0 ** 60 + 1, 7e6 / 7])
    kind = floors._Kind()
    for _ in range(20):
        n = int(rng.integers(100, 800))
        index = rng.integers(0, spread, n) if rng.random() < 0.5 else \
            np.repeat(rng.integers(0, spread, n // 4 + 1), 4)[:n]
        step = rng.integers(2, 2 + int(rng.integers(1, 4)), n)
        kind.add(index.astype(np.int64), step.astype(np.int64), rng.choice(values, n))
        for _ in range(int(rng.integers(0, 5))):  # rows one by one between the arrays
            kind.one((int(rng.integers(0, spread)), 2, float(rng.choice(values))))
    assert sum(len(c[0]) for c in kind.chunks) > floors.DICT_SUM_UP_TO
    got = kind.items()
    assert got == _old_items(kind)
    assert len({k for k, _ in got}) == len(got) > 50


def test_a_kind_with_an_index_below_zero_is_summed_by_the_sort():
    """Resources numbered from 0 are summed by key; any other numbering by the sort
    (the dense arrays would wrap a negative key round to the end)."""
    rng = np.random.default_rng(1)
    kind = floors._Kind()
    for _ in range(12):
        index = rng.integers(-1, 50, 500).astype(np.int64)
        kind.add(index, np.zeros(500, dtype=np.int64), rng.choice([0.1, 1e17 / 3, 3.0], 500))
    assert kind.items() == _old_items(kind)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("step", [0, 3])
def test_a_kind_of_one_step_is_summed_by_its_index_alone(seed, step):
    """Every addition at one step: the codes are the indices themselves (round eleven),
    the same keys, order and sums as the codes over the steps' span."""
    rng = np.random.default_rng(seed)
    values = np.array([0.1, 1e17 / 3, 3.0, 12345.5, 2.0 ** 60 + 1, 7e6 / 7])
    kind = floors._Kind()
    for _ in range(12):
        n = int(rng.integers(300, 700))
        kind.add(rng.integers(0, 900, n).astype(np.int64), np.full(n, step, dtype=np.int64),
                 rng.choice(values, n))
    got = kind.items()
    assert got == _old_items(kind)
    assert {s for (_, s), _ in got} == {step}


@pytest.mark.parametrize("seed", range(6))
def test_bincount_adds_in_the_order_given_as_add_at(seed):
    """What :func:`floors._dense_sums` rests on: ``np.bincount``'s weights are added one
    by one in the order given into zeros, the same floats as ``np.add.at``'s, on bytes
    whose sums change with their order."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 50, 5000)
    nbytes = rng.choice([0.1, 1e17 / 3, 3.0, 2.0 ** 60 + 1, -7e6 / 7, 1e-5], 5000)
    slow = np.zeros(60)
    np.add.at(slow, codes, nbytes)
    fast = np.bincount(codes, weights=nbytes, minlength=60)
    assert fast.tobytes() == slow.tobytes()
    shuffled = np.zeros(60)  # the same bytes in another order: other sums
    order = rng.permutation(5000)
    np.add.at(shuffled, codes[order], nbytes[order])
    assert shuffled.tobytes() != slow.tobytes()

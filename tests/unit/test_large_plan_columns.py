"""The passes a 1,024-device plan's columns skip, each against the pass it replaces:
send_order's columns of one value written as that value (not gathered), work's
planning positions and steps of a sends-only plan (not scattered where the order is
every row's), point_rows.cat of one part (that part itself), and array_key.ArrayKey
(a work list's signature compared without copying its arrays to bytes)."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.planner.schedule import send_order
from reshard.planner.schedule.array_key import ArrayKey
from reshard.planner.schedule.point_rows import PointColumns, cat
from reshard.planner.schedule.work import _as_planned
from tests.unit.test_send_order import _objects, ordered_as_reference

N = send_order.SAME_FROM + 123


def _uniform(rng, n, same):
    """Point-to-point columns whose columns named in ``same`` hold one value (one row
    of those changed where ``same`` names "-1 differs")."""
    ndim = np.full(n, 2) if "ndim" in same else rng.integers(1, 3, n)
    box = np.zeros((n, 4), dtype=np.int64)
    for j in range(2):
        lo = rng.integers(0, 1 << 10, n) * 8
        box[:, 2 * j] = np.where(j < ndim, lo, 0)
        box[:, 2 * j + 1] = np.where(j < ndim, lo + rng.integers(1, 9, n), 0)
    root = rng.integers(0, 128, n)
    recv = (root + rng.integers(1, 127, n)) % 128
    tensor = np.full(n, 3) if "tensor" in same else rng.integers(0, 2, n)
    nbytes = np.full(n, 4096) if "nbytes" in same else rng.choice([1024, 4096], n)
    if "-1 differs" in same:
        tensor[-1], nbytes[-1] = 2, 1 << 33
    return PointColumns(tensor, root, recv, nbytes, box, ndim)


@pytest.mark.parametrize("seed,same,general,one_step", [
    (0, {"tensor", "ndim", "nbytes"}, False, True),
    (1, {"tensor", "ndim", "nbytes"}, True, True),
    (2, {"tensor", "nbytes", "-1 differs"}, False, True),
    (3, {"ndim"}, True, False),
    (4, {"tensor", "ndim", "nbytes"}, False, False),
    (5, set(), False, True),
])
def test_columns_of_one_value_are_the_rows_gathered(seed, same, general, one_step):
    rng = np.random.default_rng(seed)
    p2p = _uniform(rng, N, same)
    objects = _objects(rng, 0 if seed % 2 == 0 else 12)
    seq = rng.permutation(N + len(objects)).astype(np.int64)
    obj_seq, p_seq = seq[:len(objects)], seq[len(objects):].copy()
    if general:
        p_seq[rng.integers(0, N, N // 7)] = -1
    p_step = np.full(N, 2, np.int64) if one_step else rng.integers(0, 3, N)
    got, cols = ordered_as_reference(objects, obj_seq, p2p, p_seq, p_step)
    s = got.send_columns
    rows = np.arange(0, len(s.position), 97)
    assert [t.tensor for t in s.tasks(rows)] == cols[1][rows].tolist()
    assert [t.step for t in s.tasks(rows)] == cols[5][rows].tolist()


def _scattered(ref, after, first):
    """work.assemble's positions and steps of a sends-only plan, scattered as before."""
    n = len(ref)
    p_seq, p_step = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    p_seq[ref] = first + np.arange(n)
    p_step[ref] = after
    return p_seq, p_step


@pytest.mark.parametrize("case", range(8))
def test_sends_only_positions_are_the_scatter(case):
    rng = np.random.default_rng(case)
    n = [0, 1, 5, 300, 300, 300, 300, 300][case]
    ref = np.arange(n, dtype=np.int64)
    if case == 4:
        ref = rng.permutation(n).astype(np.int64)
    if case == 5:
        ref[[0, 1]] = ref[[1, 0]]  # every row in order but the first two
    if case == 6:
        ref = np.roll(ref, 1)
    if case == 7:
        ref[[150, 151]] = ref[[151, 150]]  # the first row first, two later ones swapped
    after = rng.integers(0, 4, n).astype(np.int64)
    first = [0, 3, 0, 7, 0, 2, 5, 1][case]
    got, want = _as_planned(ref, after, first), _scattered(ref, after, first)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_cat_of_one_part_is_that_part_and_of_several_their_concatenation():
    a, b = np.arange(5, dtype=np.int64), np.array([7, 8], np.int64)
    assert cat([a]) is a
    assert np.array_equal(cat([a, b]), np.concatenate([a, b]))
    assert cat([]).dtype == np.int64 and not len(cat([]))


@pytest.mark.parametrize("a,b", [
    (np.arange(6), np.arange(6)),
    (np.arange(6), np.arange(5)),
    (np.arange(6), np.array([0, 1, 2, 3, 4, 9])),
    (np.zeros(0, np.int64), np.zeros(0, np.int64)),
    (np.arange(4, dtype=np.int64), np.arange(8, dtype=np.int32)[[0, 0, 1, 0, 2, 0, 3, 0]]),
    (np.arange(4, dtype=np.int32), np.arange(4, dtype=np.int64)),
    (np.arange(6).reshape(2, 3), np.arange(6).reshape(3, 2)),
    (np.array([0.0]), np.array([-0.0])),
    (np.array([np.nan]), np.array([np.nan])),
])
def test_array_keys_compare_as_their_bytes(a, b):
    ka, kb = ArrayKey(a), ArrayKey(b)
    assert (ka == kb) == (a.tobytes() == b.tobytes())
    assert (ka != kb) == (a.tobytes() != b.tobytes())
    assert ka == ArrayKey(a) and hash(ka) == hash(ArrayKey(a.copy()))
    assert ((ka,) == (kb,)) == ((a.tobytes(),) == (b.tobytes(),))
    if ka == kb:
        assert hash(ka) == hash(kb)

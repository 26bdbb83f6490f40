"""decompose._grid's array steps against the numpy calls they replace: the pairs of
piece sets intersected by their distinct sets (_PieceSets.intersect_outer) against
intersect of every repeated and tiled pair (the same ids, assigned in the same order),
the cells' corners written in place (_extended) against repeat, tile and mask, the
repeat check by counting (_repeats) against sorting, and _volumes against np.prod;
then whole tables of uneven, overlapping layouts against the grid they replace."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.cells import decompose as dec
from tests.unit.test_decompose_fast import _random_boxes


def _sets(rng, pieces):
    devs = [frozenset(rng.sample(range(12), rng.randint(1, 3))) for _ in range(pieces)]
    sets = dec._PieceSets(devs)
    for _ in range(pieces):  # some sets besides everything and nothing
        sets._id(frozenset(rng.sample(range(pieces), rng.randint(1, pieces))))
    return sets, devs


def _state(sets):
    return list(sets.sets), list(sets.device_set), sets.distinct_devices()


@pytest.mark.parametrize("seed", range(10))
def test_intersect_outer_is_intersect_of_every_pair(seed):
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    sets, devs = _sets(rng, rng.randint(2, 7))
    twin = dec._PieceSets(devs)
    for members in sets.sets[2:]:
        twin._id(members)
    ids = len(sets.sets)
    a = nrng.integers(0, ids, rng.randint(0, 9))
    b = nrng.integers(0, ids, rng.randint(0, 9))
    keep = nrng.integers(0, 3, len(a) * len(b)) > 0 if seed % 2 else None
    want = twin.intersect(np.repeat(a, len(b)), np.tile(b, len(a)))
    if keep is not None:
        want = twin.intersect(np.repeat(a, len(b))[keep], np.tile(b, len(a))[keep])
    got = sets.intersect_outer(a, b, keep)
    assert got.dtype == np.int64 and np.array_equal(got, want)
    assert _state(sets) == _state(twin)  # new sets numbered in the same order


@pytest.mark.parametrize("seed", range(6))
def test_extended_is_repeat_and_tile(seed):
    rng = np.random.default_rng(seed)
    n, k, d = int(rng.integers(0, 6)), int(rng.integers(0, 6)), int(rng.integers(0, 3))
    corners, bounds = rng.integers(0, 99, (n, d)), rng.integers(0, 99, k)
    needed = rng.integers(0, 2, n * k) > 0
    for mask in (np.ones(n * k, dtype=bool), needed):
        want = np.concatenate((np.repeat(corners, k, axis=0)[mask],
                               np.tile(bounds, n)[mask, None]), axis=1)
        got = dec._extended(corners, bounds, None if mask.all() else np.flatnonzero(mask))
        assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("seed", range(6))
def test_repeats_and_volumes_are_the_sort_and_prod(seed):
    rng = np.random.default_rng(seed)
    for span, n in ((10, 8), (50, 60), (1 << 30, 40), (3, 1), (3, 0)):
        codes = rng.choice(span, n, replace=n > span or seed % 2 == 0)
        pairs = np.sort(codes)
        assert dec._repeats(codes, span) == (not bool((pairs[1:] != pairs[:-1]).all()))
    ext = rng.integers(0, 1 << 20, (40, 1 + seed % 3))
    assert np.array_equal(dec._volumes(ext), np.prod(ext, axis=1))


def _grid_as_before(shape, src, dst, src_sets, dst_sets):
    """_grid as it was: every pair repeated and tiled, intersected and masked."""
    ndim = len(shape)
    src_lo, src_hi = dec._bounds([b for b, _ in src], ndim)
    dst_lo, dst_hi = dec._bounds([b for b, _ in dst], ndim)
    cell_lo, cell_hi = np.zeros((1, 0), dtype=np.int64), np.zeros((1, 0), dtype=np.int64)
    cell_src = np.full(1, src_sets.everything, dtype=np.int64)
    cell_dst = np.full(1, dst_sets.everything, dtype=np.int64)
    for d in range(ndim):
        pts = np.unique(np.concatenate(([0, shape[d]], src_lo[:, d], src_hi[:, d],
                                        dst_lo[:, d], dst_hi[:, d])))
        lo, hi = pts[:-1], pts[1:]
        iv_dst = dst_sets.covering(lo, hi, dst_lo[:, d], dst_hi[:, d])
        keep = iv_dst != dst_sets.nothing
        lo, hi, iv_dst = lo[keep], hi[keep], iv_dst[keep]
        iv_src = src_sets.covering(lo, hi, src_lo[:, d], src_hi[:, d])
        n, k = len(cell_src), len(lo)
        new_dst = dst_sets.intersect(np.repeat(cell_dst, k), np.tile(iv_dst, n))
        needed = new_dst != dst_sets.nothing
        new_src = src_sets.intersect(np.repeat(cell_src, k)[needed], np.tile(iv_src, n)[needed])
        cell_lo = np.concatenate((np.repeat(cell_lo, k, axis=0)[needed],
                                  np.tile(lo, n)[needed, None]), axis=1)
        cell_hi = np.concatenate((np.repeat(cell_hi, k, axis=0)[needed],
                                  np.tile(hi, n)[needed, None]), axis=1)
        cell_src, cell_dst = new_src, new_dst[needed]
    return cell_lo, cell_hi, cell_src, cell_dst


@pytest.mark.parametrize("seed", range(4))
def test_grid_is_the_grid_it_replaces(seed):
    rng = random.Random(100 + seed)
    for _ in range(120):
        ndim = rng.randint(1, 3)
        shape = tuple(rng.randint(1, 12) for _ in range(ndim))
        holders = _random_boxes(rng, shape, rng.randint(1, 5), list(range(8)))
        needers = _random_boxes(rng, shape, rng.randint(1, 5), list(range(4, 16)))
        src, dst = dec.pieces(holders), dec.pieces(needers)
        if not src or not dst:
            continue
        sets = [dec._PieceSets([devs for _, devs in side]) for side in (src, dst, src, dst)]
        got = dec._grid(shape, src, dst, sets[0], sets[1])
        want = _grid_as_before(shape, src, dst, sets[2], sets[3])
        for x, y in zip(got, want):
            assert x.dtype == y.dtype and np.array_equal(x, y)
        assert _state(sets[0]) == _state(sets[2]) and _state(sets[1]) == _state(sets[3])

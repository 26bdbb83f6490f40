"""Packing boxes of a shard: zero-copy when the box is contiguous, exact otherwise."""

from __future__ import annotations

import numpy as np

from reshard.comm.packing import pack, recv_target, unpack

SHARD_BOX = ((4, 8), (0, 6), (10, 13))  # the shard holds rows 4..8 of a global tensor


def _shard():
    return np.arange(4 * 6 * 3, dtype=np.float32).reshape(4, 6, 3)


def test_contiguous_box_is_a_view():
    shard = _shard()
    box = ((5, 7), (0, 6), (10, 13))  # whole trailing dims: one run of memory
    buf = pack(shard, box, SHARD_BOX)
    assert np.shares_memory(buf, shard) and buf.shape == (2 * 6 * 3,)
    assert np.array_equal(buf, shard[1:3].reshape(-1))
    target = recv_target(shard, box, SHARD_BOX, np.empty(100, np.float32))
    assert np.shares_memory(target, shard)  # received straight into the shard


def test_strided_box_is_copied_into_scratch_and_back():
    shard = _shard()
    box = ((4, 6), (2, 4), (11, 13))
    scratch = np.zeros(64, np.float32)
    buf = pack(shard, box, SHARD_BOX, scratch[:8])
    assert np.shares_memory(buf, scratch) and not np.shares_memory(buf, shard)
    assert np.array_equal(buf, shard[0:2, 2:4, 1:3].reshape(-1))
    other = np.zeros_like(shard)
    target = recv_target(other, box, SHARD_BOX, scratch)
    assert np.shares_memory(target, scratch)
    target[:] = buf
    unpack(other, box, SHARD_BOX, target)
    assert np.array_equal(other[0:2, 2:4, 1:3], shard[0:2, 2:4, 1:3])
    assert other.sum() == shard[0:2, 2:4, 1:3].sum()  # nothing else written

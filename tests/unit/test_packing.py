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


def test_unpacker_copies_the_slices_each_prefix_completes():
    """A strided box unpacked as its packed buffer fills: after ``upto(n)`` exactly the
    outermost slices the first ``n`` bytes complete are in place, nothing else;
    ``finish`` writes the rest. Boxes whose leading dims are 1 cut the first longer
    dim."""
    from reshard.comm.packing import Unpacker

    shard = _shard()
    for box in (((4, 7), (1, 5), (11, 13)), ((5, 6), (0, 6), (10, 12)),
                ((4, 5), (2, 5), (10, 12))):
        sl = tuple(slice(a - s, b - s) for (a, b), (s, _) in zip(box, SHARD_BOX))
        shape = shard[sl].shape
        buf = pack(shard, box, SHARD_BOX, np.empty(int(np.prod(shape)), np.float32))
        other = np.zeros_like(shard)
        target = recv_target(other, box, SHARD_BOX, np.empty(64, np.float32))
        target[:] = buf
        sink = Unpacker(other, box, SHARD_BOX, target)
        dim = next((d for d, e in enumerate(shape) if e > 1), 0)
        per = int(np.prod(shape[dim + 1:])) * 4
        for nbytes in range(0, buf.nbytes + 1, 5):
            sink.upto(nbytes)
            k = min(shape[dim], nbytes // per)
            want = np.zeros_like(shard)
            lead = (slice(None),) * dim
            want[sl][(*lead, slice(0, k))] = shard[sl][(*lead, slice(0, k))]
            assert np.array_equal(other, want), (box, nbytes)
        sink.finish()
        assert np.array_equal(other[sl], shard[sl]) and other.sum() == shard[sl].sum()

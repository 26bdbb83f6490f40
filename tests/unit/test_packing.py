"""Packing boxes of a shard: zero-copy when the box is contiguous, exact otherwise."""

from __future__ import annotations

import numpy as np

from reshard.comm.engine.packing import pack, recv_target, unpack

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
    from reshard.comm.engine.packing import Unpacker

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


def _boxes(seed: int, count: int):
    """Random (shard box, box inside it) pairs of 1-4 dims, empty boxes included."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        shard_box = tuple((int(o), int(o) + int(n)) for o, n in
                          zip(rng.integers(0, 6, 4), rng.integers(1, 6, 4)))[
            :int(rng.integers(1, 5))]
        box = []
        for a, b in shard_box:
            lo = int(rng.integers(a, b))
            box.append((lo, int(rng.integers(lo, b + 1))))
        yield shard_box, tuple(box)


def test_byte_span_is_numpys_answer():
    """Where numpy's own view of the box is one C-contiguous run, its bytes in the
    shard; None where numpy's view is strided (or empty)."""
    from reshard.comm.engine.packing import byte_span, region

    runs = 0
    for shard_box, box in _boxes(1, 3000):
        shard = np.zeros([b - a for a, b in shard_box], np.int16)
        view = region(shard, box, shard_box)
        got = byte_span(box, shard_box, 2)
        if view.size and view.flags.c_contiguous:
            start = view.__array_interface__["data"][0] - shard.__array_interface__["data"][0]
            assert got == (start, start + view.nbytes), (shard_box, box)
            runs += 1
        else:
            assert got is None, (shard_box, box)
    assert runs > 300  # both kinds were drawn


def test_row_runs_hold_the_box_in_order():
    """A strided box's runs, as elements of one void dtype over the shard's memory, are
    the box's bytes in C order (what packing it gives)."""
    from reshard.comm.engine.packing import region, row_runs

    strided = 0
    for shard_box, box in _boxes(2, 3000):
        shard = np.arange(np.prod([b - a for a, b in shard_box]), dtype=np.int32).reshape(
            [b - a for a, b in shard_box])
        view = region(shard, box, shard_box)
        got = row_runs(box, shard_box, 4)
        if not view.size or view.flags.c_contiguous:
            assert got is None
            continue
        shape, run, offset, strides = got
        rows = np.ndarray(shape, np.dtype((np.void, run)), buffer=shard, offset=offset,
                          strides=strides)
        assert rows.tobytes() == np.ascontiguousarray(view).tobytes(), (shard_box, box)
        strided += 1
    assert strided > 100  # strided boxes were drawn

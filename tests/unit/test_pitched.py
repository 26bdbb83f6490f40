"""comm.pitched's geometry, checked by carrying out its copies byte by byte on numpy
memory and comparing with numpy's own assignment, for the boxes plans pack and unpack
(a box of a shard into a contiguous buffer and back), and for views it must leave to
the kernel."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshard.comm.engine.pitched import MAX_COPIES, MIN_ROW, copy_into, pitched_copies


def _offset(view: np.ndarray, base: np.ndarray) -> int:
    return view.__array_interface__["data"][0] - base.__array_interface__["data"][0]


def _pitched_equals_assignment(dst: np.ndarray, dbase: np.ndarray, src: np.ndarray,
                               sbase: np.ndarray) -> bool:
    """Carry out ``dst[...] = src``'s pitched copies (any row length) on ``dbase``'s
    bytes as cudaMemcpy2D would, and check them against numpy's assignment on a copy.
    False where the geometry declines."""
    copies = pitched_copies(dst.shape, dst.strides, src.strides, dst.itemsize, min_row=1)
    if copies is None:
        return False
    want = dbase.copy()
    np.lib.stride_tricks.as_strided(want.reshape(-1)[_offset(dst, dbase) // dst.itemsize:],
                                    dst.shape, dst.strides)[...] = src
    db, sb = dbase.reshape(-1).view(np.uint8), sbase.reshape(-1).view(np.uint8)
    d0, s0 = _offset(dst, dbase), _offset(src, sbase)
    for c in copies:
        assert c.width <= min(c.dpitch, c.spitch) or c.height == 1
        for r in range(c.height):
            d, s = d0 + c.dst + r * c.dpitch, s0 + c.src + r * c.spitch
            db[d:d + c.width] = sb[s:s + c.width]
    assert dbase.tobytes() == want.tobytes()
    return True


@st.composite
def boxes(draw):
    """A shard shape, a box inside it, and an itemsize."""
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 9)) for _ in range(ndim))
    box = []
    for n in shape:
        a = draw(st.integers(0, n - 1))
        box.append(slice(a, draw(st.integers(a + 1, n))))
    return shape, tuple(box), draw(st.sampled_from([1, 2, 4, 8]))


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(case=boxes())
def test_pack_and_unpack_geometry(case):
    shape, box, item = case
    dt = np.dtype(f"V{item}")
    shard = np.random.default_rng(0).integers(0, 256, size=int(np.prod(shape)) * item,
                                              dtype=np.uint8).view(dt).reshape(shape)
    view = shard[box]
    flat = np.zeros(view.size, dt)
    packed = _pitched_equals_assignment(flat.reshape(view.shape), flat, view, shard)
    other = np.zeros(shape, dt)
    dense = np.ascontiguousarray(view)
    unpacked = _pitched_equals_assignment(other[box], other, dense, dense)
    # a box cut in at most two dims (after merging) is always covered
    cuts = sum(1 for n, s in zip(shape, box) if s.stop - s.start not in (n,))
    if cuts <= 2:
        assert packed and unpacked


def test_rows_are_one_copy_and_two_cuts_loop():
    a = np.zeros((8, 16, 64), np.float32)  # rows of 64 floats (256 bytes)
    box = a[1:5, 2:9, :]
    dense = np.empty(box.shape, np.float32)
    (c,) = pitched_copies(box.shape, dense.strides, box.strides, 4)  # pack
    assert (c.height, c.width, c.spitch, c.dpitch) == (4, 7 * 256, 16 * 256, 7 * 256)
    assert c.src == 0 and c.dst == 0
    cut = a[1:5, 2:9, 0:64]  # the same
    assert pitched_copies(cut.shape, cut.strides, dense.strides, 4)[0].height == 4
    b = np.zeros((8, 16, 128), np.float32)[1:5, 2:9, 0:64]  # cut in all three dims
    got = pitched_copies(b.shape, np.empty(b.shape, np.float32).strides, b.strides, 4)
    assert len(got) == 4 and all(g.height == 7 and g.width == 256 for g in got)
    assert [g.src for g in got] == [i * 16 * 128 * 4 for i in range(4)]


def test_what_stays_with_the_kernel():
    a = np.zeros((4, 100, 100), np.float32)
    narrow = a[:, :, :10]  # 40-byte rows
    assert MIN_ROW > 40
    assert pitched_copies(narrow.shape, np.empty(narrow.shape, np.float32).strides,
                          narrow.strides, 4) is None
    many = np.zeros((MAX_COPIES + 1, 3, 4, 256), np.float32)[:, :2, :3, :]
    assert pitched_copies(many.shape, np.empty(many.shape, np.float32).strides,
                          many.strides, 4) is None
    rev = a[:, ::-1, :]
    assert pitched_copies(rev.shape, np.empty(rev.shape, np.float32).strides,
                          rev.strides, 4) is None
    assert pitched_copies((0, 4), (16, 4), (16, 4), 4) is None


def test_copy_into_assigns_numpy():
    a = np.arange(24.0).reshape(4, 6)
    out = np.zeros((4, 3))
    copy_into(out, a[:, ::2])
    np.testing.assert_array_equal(out, a[:, ::2])
    with pytest.raises(ValueError):
        copy_into(out, a)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(width=st.integers(1, 1 << 22), rows=st.integers(1, 1 << 21),
       pad=st.integers(0, 4096), dst=st.integers(0, 64), src=st.integers(0, 64))
def test_launch_covers_every_row_with_aligned_loads(width, rows, pad, dst, src):
    """The widest load every row start, pitch and row length allow; every element of
    every row reached by the grid (or by its grid-stride loops, at the grid's caps)."""
    from reshard.comm.engine.pitched import THREADS, UNROLL, Copy, launch

    c = Copy(0, width, 0, width + pad, width, rows)
    go = launch(c, 4096 + dst, 8192 + src)
    v = go.vector
    assert go.kernel == f"reshard_pitched_{v}" and v * go.n == width
    for x in (4096 + dst, 8192 + src, width) + ((width, width + pad) if rows > 1 else ()):
        assert x % v == 0
    assert v == 16 or any(x % (2 * v) for x in (4096 + dst, 8192 + src, width)
                          + ((width, width + pad) if rows > 1 else ()))
    (gx, gy, gz), (bx, by, bz) = go.grid, go.block
    assert bx * by == THREADS and bz == gz == 1 and bx & (bx - 1) == 0 and bx >= 32
    assert gx * bx * UNROLL[v] >= go.n or gx == 4096
    assert gy * by >= rows or gy == 65535

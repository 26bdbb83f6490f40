"""Where the fused cast kernels read and write: a box of a tensor as at most three dims,
and each kernel's grid (pure: shapes, strides and addresses in, integers out).

A cast reads a view of a shard (``box`` of the global tensor, element strides of its
own), writes a view of the same shape, and finds each element's scale (or, for the
block amax, its cell) at ``base + sum((g_d + i_d) >> shift_d) * st_d)``, ``g_d`` the
box's global start, ``shift_d`` the log2 of the block's edge (62: the box lies in one
block along ``d``), ``st_d`` the scales array's stride. :func:`geometry` brings any
box to the kernels' three dims ``(L, R, C)``: dims of length 1 fold into ``base``, a
dim whose block index is linear (edge 1) or constant folds its start into ``base``,
neighbours whose strides agree merge while more than three remain; None where the
view does not fit (then the caller's general path runs). :class:`Geo` is what the
kernels' ``GEO_PARAMS`` take (:mod:`reshard.core.kernels.cast_source`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from reshard.core.kernels.cast_source import AMAX_UNROLL

ONE_BLOCK = 62
"""The shift of a dim the box meets in one block only (every index's block is 0)."""

TILE_SHIFT = 5
"""log2 of an amax row tile's rows, at most (fewer where a block has fewer rows)."""

THREADS = 256
"""Threads per block of every kernel."""

MAX_GRID_Y = 65535
"""CUDA's limit on a grid's y (the kernels loop over what lies beyond)."""


class Dim(NamedTuple):
    """One dim of a cast's view: extent, source / destination element strides, global
    start, block shift and scale stride."""

    n: int
    ss: int
    ds: int
    g: int
    sh: int
    st: int


_UNIT = Dim(1, 0, 0, 0, ONE_BLOCK, 0)


class Geo(NamedTuple):
    """The view as the kernels take it (``GEO_PARAMS``, in order): dims L, R, C, the
    scales' base offset, the amax row tiles (log2 of their rows, the first's index,
    how many per index of L) and the vector width (elements, 1 or 16 bytes' worth)."""

    dims: tuple[Dim, Dim, Dim]
    base: int
    tsh: int
    t0: int
    tiles: int
    vec: int

    def args(self) -> tuple[int, ...]:
        """The kernels' 22 ``long long`` geometry arguments."""
        d = self.dims
        return (*(x.n for x in d), *(x.ss for x in d), *(x.ds for x in d),
                *(x.g for x in d), *(x.sh for x in d), *(x.st for x in d),
                self.base, self.tsh, self.t0, self.tiles)


def _shift(edge: int, start: int, stop: int) -> int | None:
    """The shift of a block edge: its log2, ONE_BLOCK where [start, stop) lies in
    block 0 (an edge that is no power of two: a whole-tensor block), else None."""
    if stop <= edge:
        return ONE_BLOCK
    if edge & (edge - 1) == 0:
        return edge.bit_length() - 1
    return None


def _flat(d: Dim) -> Dim:
    """``d`` with its start folded out where its block index is constant or linear
    (the caller adds the returned dim's lost part to the base: see :func:`_fold`)."""
    if d.st == 0 or d.sh == ONE_BLOCK:
        return Dim(d.n, d.ss, d.ds, 0, ONE_BLOCK, 0)
    if d.sh == 0:
        return Dim(d.n, d.ss, d.ds, 0, 0, d.st)
    return d


def _fold(d: Dim) -> int:
    """What :func:`_flat` moves into the base: the start's block times its stride."""
    if d.st == 0 or d.sh == ONE_BLOCK:
        return (d.g >> d.sh) * d.st
    if d.sh == 0:
        return d.g * d.st
    return 0


def _merge(a: Dim, b: Dim) -> Dim | None:
    """Outer dim ``a`` and inner ``b`` as one dim, where their strides agree."""
    if a.ss != b.n * b.ss or a.ds != b.n * b.ds:
        return None
    if a.st == 0 and b.st == 0:
        return Dim(a.n * b.n, b.ss, b.ds, 0, ONE_BLOCK, 0)
    if a.sh == 0 and b.sh == 0 and a.st == b.n * b.st:
        return Dim(a.n * b.n, b.ss, b.ds, 0, 0, b.st)
    return None


def _three(dims: list[Dim]) -> list[Dim] | None:
    """At most three dims, merging the outermost neighbours that merge first."""
    while len(dims) > 3:
        for k in range(len(dims) - 1):
            m = _merge(dims[k], dims[k + 1])
            if m is not None:
                dims[k:k + 2] = [m]
                break
        else:
            return None
    return [_UNIT] * (3 - len(dims)) + dims


def _rows_of_one(dims: list[Dim]) -> list[Dim]:
    """A long single row without blocks along it (a tensor scale, a plain cast) cut into
    rows of up to 4096 elements, so that the amax's row tiles share its atomics."""
    c = dims[2]
    if dims[0].n * dims[1].n != 1 or c.st or c.n < 8192:
        return dims
    w = next((w for w in (4096, 2048, 1024, 512, 256) if c.n % w == 0), 0)
    if not w:
        return dims
    return [_UNIT, Dim(c.n // w, w * c.ss, w * c.ds, 0, ONE_BLOCK, 0),
            Dim(w, c.ss, c.ds, 0, ONE_BLOCK, 0)]


def _vector(dims: Sequence[Dim], src_item: int, dst_item: int, src_addr: int,
            dst_addr: int) -> int:
    """Elements per thread's load: 16 bytes of source where C is contiguous in both
    views, every row starts aligned, and a vector never crosses a block; else 1."""
    v = 16 // src_item
    c = dims[2]
    if c.ss != 1 or c.ds != 1 or c.n % v:
        return 1
    if c.st and c.sh != ONE_BLOCK and (c.g % v or (1 << c.sh) % v):
        return 1
    if src_addr % (v * src_item) or dst_addr % (v * dst_item):
        return 1
    if any(d.n > 1 and (d.ss % v or d.ds % v) for d in dims[:2]):
        return 1
    return v


def geometry(box: Sequence[tuple[int, int]], src_strides: Sequence[int],
             dst_strides: Sequence[int], block: Sequence[int], scale_start: Sequence[int],
             scale_strides: Sequence[int], src_item: int, dst_item: int, src_addr: int = 0,
             dst_addr: int = 0) -> Geo | None:
    """The kernels' view of a cast of ``box`` (global ``(start, stop)`` per dim).

    Args:
        box: the elements' global box (not empty).
        src_strides, dst_strides: element strides of the source and destination views
            (the amax has no destination: pass the source's).
        block: the scale block's edge per dim (a whole-tensor block: the tensor's
            extent; no scales: any edges with zero ``scale_strides``).
        scale_start: the block index of the scales array's first element per dim.
        scale_strides: the scales array's element strides per dim (zeros: one scale).
        src_item, dst_item: bytes per element.
        src_addr, dst_addr: the views' first elements' addresses (for the vector width).

    Returns:
        The geometry, or None where the kernels do not take the view (more than three
        dims left after merging, a negative stride, a block edge that is no power of two
        across which the box reaches).
    """
    if not box or any(c <= a for a, c in box):
        return None
    if any(s < 0 for s in (*src_strides, *dst_strides, *scale_strides)):
        return None
    base = -sum(s0 * st for s0, st in zip(scale_start, scale_strides))
    dims: list[Dim] = []
    for (a, c), ss, ds, b, st in zip(box, src_strides, dst_strides, block, scale_strides):
        sh = _shift(int(b), a, c)
        if sh is None:
            return None
        d = Dim(c - a, int(ss), int(ds), a, sh, int(st))
        if d.n == 1:
            base += (a >> sh) * d.st
            continue
        base += _fold(d)
        dims.append(_flat(d))
    three = _three(dims)
    if three is None:
        return None
    three = _rows_of_one(three)
    r = three[1]
    tsh = min(r.sh, TILE_SHIFT)
    t0 = r.g >> tsh
    tiles = ((r.g + r.n - 1) >> tsh) - t0 + 1
    vec = _vector(three, src_item, dst_item, src_addr, dst_addr)
    return Geo((three[0], three[1], three[2]), base, tsh, t0, tiles, vec)


class Grid(NamedTuple):
    """A kernel's launch: its grid and block."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]


def quantize_grid(geo: Geo) -> Grid:
    """x threads along a row's vectors (a power of two from 32 to :data:`THREADS`
    sized to the row), the rest of a block's threads over rows."""
    l, r, c = geo.dims
    nv = c.n // geo.vec
    rows = l.n * r.n
    bx = min(THREADS, max(32, 1 << max(0, (nv - 1).bit_length())))
    by = THREADS // bx
    gx = min(-(-nv // bx), 4096)
    gy = min(-(-rows // by), MAX_GRID_Y)
    return Grid((gx, gy, 1), (bx, by, 1))


def amax_grid(geo: Geo) -> Grid:
    """:data:`THREADS` // 32 warps a block along C, each :data:`AMAX_UNROLL` rounds of
    32 vectors; the grid's y over row tiles (every index of L)."""
    l, _, c = geo.dims
    nv = c.n // geo.vec
    warps = -(-nv // (32 * AMAX_UNROLL))
    per = THREADS // 32
    gx = -(-warps // per)
    gy = min(l.n * geo.tiles, MAX_GRID_Y)
    return Grid((gx, gy, 1), (THREADS, 1, 1))


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape``."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(out))


def scale_count(shape: Sequence[int]) -> int:
    """Elements of a scales (amax) array of ``shape``."""
    return math.prod(int(n) for n in shape)


__all__ = ["ONE_BLOCK", "THREADS", "Dim", "Geo", "Grid", "amax_grid", "contiguous_strides",
           "geometry", "quantize_grid", "scale_count"]

"""Copying one strided view into another on a GPU: rows at a pitch, one kernel.

A box of a shard that is not one run of memory is rows of equal length at a constant
pitch (most boxes a plan packs: the dimensions after the last one a box cuts are
whole). cupy's assignment of such a view runs its elementwise kernel, which computes
every element's address from the view's shape and strides (64-bit divisions per
element) and moves 4 bytes per thread: 0.40x the bandwidth of a plain device-to-device
copy on an H200 (``cudaMemcpy2DAsync`` of the same rows: 0.34-0.79x, depending on the
rows' alignment). :data:`SOURCE` is a copy kernel of reshard's own: a thread block's x
threads walk a row in the widest loads the rows' alignment allows (16, 8, 4, 2 or 1
bytes), its y threads cover several rows when rows are short, and every thread has
several loads in flight before it stores them (:data:`UNROLL`; microbench/gpu_pack.py
measures all four ways).

:func:`pitched_copies` is the geometry (pure: shapes and byte strides in, copies
out), :func:`launch` a copy's kernel and grid (pure); :func:`copy_into` is
``dst[...] = src`` that runs those copies for cupy arrays on the current stream, and
assigns otherwise (numpy, torch, or a view the geometry does not cover: rows shorter
than :data:`MIN_ROW` bytes, more than :data:`MAX_COPIES` copies).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Protocol

import numpy as np

_U64, _I64 = np.uint64, np.int64  # a kernel's pointer and 64-bit integer arguments

MIN_ROW = 64
"""Rows shorter than this (bytes) are left to cupy's assignment (most of a warp would
idle on each row)."""

MAX_COPIES = 64
"""At most this many pitched copies per view (a box cut in three dimensions is one per
outermost row); beyond, the kernel."""

MAX_PITCH = 1 << 62
"""The largest pitch (bytes) the kernel's 64-bit offsets take."""

THREADS = 256
"""Threads per block of the copy kernel."""

SOURCE = r"""
// rows of n elements of T, row r from src + r*spitch to dst + r*dpitch (bytes);
// x threads along a row, y threads over rows, up to U loads in flight per thread
// (all issued before any store, also in a row's last, partial round)
template <typename T, int U>
__device__ __forceinline__ void copy_rows(char* __restrict__ dst, long long dpitch,
                                          const char* __restrict__ src, long long spitch,
                                          long long n, long long rows) {
  const long long step = (long long)gridDim.x * blockDim.x;
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (long long r = (long long)blockIdx.y * blockDim.y + threadIdx.y; r < rows;
       r += (long long)gridDim.y * blockDim.y) {
    T* d = reinterpret_cast<T*>(dst + r * dpitch);
    const T* s = reinterpret_cast<const T*>(src + r * spitch);
    for (long long i = first; i < n; i += U * step) {
      T v[U];
#pragma unroll
      for (int k = 0; k < U; ++k)
        if (i + k * step < n) v[k] = s[i + k * step];
#pragma unroll
      for (int k = 0; k < U; ++k)
        if (i + k * step < n) d[i + k * step] = v[k];
    }
  }
}
#define RESHARD_PITCHED(NAME, T, U)                                               \
  extern "C" __global__ void NAME(char* dst, long long dpitch, const char* src,   \
                                  long long spitch, long long n, long long rows) { \
    copy_rows<T, U>(dst, dpitch, src, spitch, n, rows);                           \
  }
RESHARD_PITCHED(reshard_pitched_16, uint4, 4)
RESHARD_PITCHED(reshard_pitched_8, uint2, 8)
RESHARD_PITCHED(reshard_pitched_4, unsigned int, 8)
RESHARD_PITCHED(reshard_pitched_2, unsigned short, 16)
RESHARD_PITCHED(reshard_pitched_1, unsigned char, 16)
"""
"""The copy kernel, one entry point per load width (``reshard_pitched_<bytes>``), each
with as many loads in flight per thread as :data:`UNROLL` says."""

UNROLL = {16: 4, 8: 8, 4: 8, 2: 16, 1: 16}
"""Loads each thread has in flight per round, per load width (64 bytes or more: enough
bytes in flight to cover HBM's latency at full bandwidth)."""


class Copy(NamedTuple):
    """One pitched copy: ``height`` rows of ``width`` bytes, from byte ``src`` of the
    source view (rows ``spitch`` apart) to byte ``dst`` of the destination view (rows
    ``dpitch`` apart); offsets from each view's first element."""

    dst: int
    dpitch: int
    src: int
    spitch: int
    width: int
    height: int


def pitched_copies(shape: tuple[int, ...], dst_strides: tuple[int, ...],
                   src_strides: tuple[int, ...], itemsize: int, *,
                   min_row: int = MIN_ROW) -> list[Copy] | None:
    """``dst[...] = src`` for two views of ``shape`` with these byte strides, as pitched
    copies; None where they would not do (see the module docstring) or the views are
    empty. Dimensions of length 1 drop; trailing dimensions contiguous in both views
    make the row; the rest merge where both views step evenly over them, and at most
    two may remain (the outer one looped). ``min_row``: see :data:`MIN_ROW`."""
    if not all(shape):
        return None
    dims = [(n, d, s) for n, d, s in zip(shape, dst_strides, src_strides) if n != 1]
    width = itemsize
    while dims and dims[-1][1] == width and dims[-1][2] == width:
        width *= dims.pop()[0]
    outer: list[tuple[int, int, int]] = []
    for n, d, s in dims:
        if d <= 0 or s <= 0:
            return None
        if outer and outer[-1][1] == n * d and outer[-1][2] == n * s:
            outer[-1] = (outer[-1][0] * n, d, s)
        else:
            outer.append((n, d, s))
    if width < min_row and outer:
        return None
    if not outer:
        return [Copy(0, width, 0, width, width, 1)]
    rows, dpitch, spitch = outer[-1]
    if max(dpitch, spitch) > MAX_PITCH or min(dpitch, spitch) < width:
        return None
    if len(outer) == 1:
        return [Copy(0, dpitch, 0, spitch, width, rows)]
    if len(outer) > 2 or outer[0][0] > MAX_COPIES:
        return None
    count, dstep, sstep = outer[0]
    return [Copy(i * dstep, dpitch, i * sstep, spitch, width, rows) for i in range(count)]


class Launch(NamedTuple):
    """One copy's kernel launch: the entry point, elements of ``vector`` bytes per row,
    the grid and the block."""

    kernel: str
    vector: int
    n: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]


def launch(c: Copy, dst_address: int, src_address: int) -> Launch:
    """The kernel and grid of copy ``c`` between views starting at these addresses:
    the widest load (16 .. 1 bytes) every row start and the row length are multiples
    of; a block's x threads a power of two from 32 to :data:`THREADS` sized to the row
    (:data:`UNROLL` elements each per round), the rest of its threads over rows."""
    starts = (dst_address + c.dst, src_address + c.src, c.width)
    pitches = (c.dpitch, c.spitch) if c.height > 1 else ()
    vector = next(v for v in (16, 8, 4, 2, 1) if all(x % v == 0 for x in starts + pitches))
    n = c.width // vector
    u = UNROLL[vector]
    bx = min(THREADS, max(32, 1 << max(0, (-(-n // u) - 1).bit_length())))
    by = THREADS // bx
    gx = min(-(-n // (u * bx)), 4096)
    gy = min(-(-c.height // by), 65535)
    return Launch(f"reshard_pitched_{vector}", vector, n, (gx, gy, 1), (bx, by, 1))


@functools.cache
def _module() -> Any:
    """The kernel's cupy module (compiled on first use, once per process: a constant's
    cache; each worker process drives one GPU)."""
    import cupy

    return cupy.RawModule(code=SOURCE)


@functools.cache
def _kernel(name: str) -> Any:
    """The module's entry point ``name`` (looked up once)."""
    return _module().get_function(name)


@functools.lru_cache(maxsize=4096)
def _launches(shape: tuple[int, ...], dst_strides: tuple[int, ...],
              src_strides: tuple[int, ...], itemsize: int, dst_align: int, src_align: int
              ) -> tuple[tuple[Copy, Launch], ...] | None:
    """:func:`pitched_copies` with each copy's :func:`launch`, for views starting at
    addresses of these residues modulo 16 (all a launch depends on); remembered per
    geometry, since a loaded plan copies the same boxes on every run (a cache of a pure
    function, not state)."""
    copies = pitched_copies(shape, dst_strides, src_strides, itemsize)
    if copies is None:
        return None
    return tuple((c, launch(c, dst_align, src_align)) for c in copies)


def _is_cupy(a: Any) -> bool:
    return type(a).__module__.startswith("cupy") and hasattr(a, "__cuda_array_interface__")


class CopySink(Protocol):
    """Where copies can wait for one launch of many (:class:`reshard.comm.engine.box_batch.
    BoxBatch`)."""

    def add(self, dst: Any, src: Any) -> bool:
        """Queue ``dst[...] = src``; False where it does not take them."""
        ...


def copy_into(dst: Any, src: Any, sink: CopySink | None = None) -> None:
    """``dst[...] = src`` (same shape and dtype): queued in ``sink`` where it takes them
    (cupy arrays: the caller flushes it), else the copy kernel on the current stream for
    cupy arrays where :func:`pitched_copies` covers them, else assignment."""
    if sink is not None and sink.add(dst, src):
        return
    if not (_is_cupy(dst) and _is_cupy(src)) or dst.dtype != src.dtype \
            or dst.shape != src.shape or (dst.flags.c_contiguous and src.flags.c_contiguous):
        dst[...] = src  # cupy copies contiguous arrays with cudaMemcpyAsync
        return
    d0, s0 = dst.data.ptr, src.data.ptr
    launches = _launches(dst.shape, dst.strides, src.strides, dst.itemsize, d0 % 16, s0 % 16)
    if launches is None:
        dst[...] = src
        return
    for c, go in launches:
        _kernel(go.kernel)(go.grid, go.block, (_U64(d0 + c.dst), _I64(c.dpitch),
                                               _U64(s0 + c.src), _I64(c.spitch),
                                               _I64(go.n), _I64(c.height)))


__all__ = ["MAX_COPIES", "MIN_ROW", "SOURCE", "Copy", "CopySink", "Launch", "copy_into", "launch",
           "pitched_copies"]

"""A step's box copies on a GPU in one kernel launch: a gather / scatter of many boxes
described by one table.

A step that packs or unpacks many small boxes (a coalesced message of 1,000 payloads,
a weight sync's norms and biases) paid one launch per box: 17-34 us of Python each on
an H200 (comm/pitched.py's kernel, cupy's copy), far more than the bytes take. A
:class:`BoxBatch` collects a step's copies instead (each as the pitched copies of
:func:`reshard.comm.engine.pitched.pitched_copies`: rows of ``width`` bytes at a pitch), and
:meth:`BoxBatch.flush` moves them all with one launch of :data:`SOURCE`'s
``reshard_boxes``: the grid's y walks the table's rows, its x threads a row's bytes in
the widest loads that row's addresses, pitches and width allow (16 .. 1 bytes).

:func:`table_rows` is the geometry (pure), :func:`boxes_grid` the launch's grid (pure);
the kernel's per-thread work is a ``__host__ __device__`` function the tests run on the
CPU over every thread of the grid (tests/unit/test_box_batch.py). Arrays that are not
cupy arrays (numpy, torch) are copied at once by :func:`reshard.comm.engine.pitched.copy_into`,
as without a batch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from reshard.comm.engine.pitched import pitched_copies
from reshard.core.kernels.cast_source import BASICS

ROW = 6
"""int64s per table row: dst address, dst pitch, src address, src pitch, width, height
(addresses and pitches in bytes)."""

THREADS = 256
"""Threads per block."""

MAX_X = 256
"""Blocks per table row at most (a longer box's threads loop)."""

BOX_COMMON = BASICS + r"""
// the widest load (16 .. 1 bytes) that every address of box b is a multiple of
__host__ __device__ __forceinline__ int box_vector(const i64* b) {
  i64 bits = b[0] | b[2] | b[4] | (b[5] > 1 ? (b[1] | b[3]) : 0);
  return (bits & 15) == 0 ? 16 : (bits & 7) == 0 ? 8 : (bits & 3) == 0 ? 4
       : (bits & 1) == 0 ? 2 : 1;
}
template <int W>
__host__ __device__ __forceinline__ void copy_box_w(const i64* b, i64 t, i64 nt) {
  const i64 n = b[4] / W, total = n * b[5];
  for (i64 i = t; i < total; i += nt) {
    const i64 r = i / n, c = i - r * n;
    copy_bytes<W>((void*)(b[0] + r * b[1] + c * W), (const void*)(b[2] + r * b[3] + c * W));
  }
}
// thread t of nt copying box b (a table row)
__host__ __device__ __forceinline__ void copy_box_part(const i64* b, i64 t, i64 nt) {
  switch (box_vector(b)) {
    case 16: copy_box_w<16>(b, t, nt); break;
    case 8: copy_box_w<8>(b, t, nt); break;
    case 4: copy_box_w<4>(b, t, nt); break;
    case 2: copy_box_w<2>(b, t, nt); break;
    default: copy_box_w<1>(b, t, nt);
  }
}
"""
"""The copy's arithmetic and each thread's work, for the GPU and (tests) the CPU."""

SOURCE = BOX_COMMON + r"""
#ifdef __CUDACC__
extern "C" __global__ void reshard_boxes(const i64* table, i64 count) {
  for (i64 k = blockIdx.y; k < count; k += gridDim.y)
    copy_box_part(table + 6 * k, (i64)blockIdx.x * blockDim.x + threadIdx.x,
                  (i64)gridDim.x * blockDim.x);
}
#endif
"""
"""The kernel: ``reshard_boxes(table, count)``."""


@functools.lru_cache(maxsize=4096)
def _copies(shape: tuple[int, ...], dst_strides: tuple[int, ...],
            src_strides: tuple[int, ...], itemsize: int) -> tuple[Any, ...] | None:
    """:func:`pitched_copies` of any row length, remembered per geometry (a loaded plan
    copies the same boxes on every run: a cache of a pure function, not state)."""
    got = pitched_copies(shape, dst_strides, src_strides, itemsize, min_row=1)
    return None if got is None else tuple(got)


def table_rows(dst_ptr: int, dst_strides: Sequence[int], src_ptr: int,
               src_strides: Sequence[int], shape: Sequence[int], itemsize: int
               ) -> list[tuple[int, ...]] | None:
    """``dst[...] = src`` (views of ``shape`` at these addresses, byte strides) as table
    rows; None where :func:`pitched_copies` does not cover the views (or they are
    empty)."""
    copies = _copies(tuple(shape), tuple(dst_strides), tuple(src_strides), itemsize)
    if copies is None:
        return None
    return [(dst_ptr + c.dst, c.dpitch, src_ptr + c.src, c.spitch, c.width, c.height)
            for c in copies]


class Grid(NamedTuple):
    """The launch's grid and block."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]


def boxes_grid(rows: Sequence[Sequence[int]]) -> Grid:
    """Blocks along x to cover the largest row's bytes in 16-byte loads (at most
    :data:`MAX_X`), one y per table row (65,535 at most: the kernel loops beyond)."""
    most = max(r[4] * r[5] for r in rows)
    gx = max(1, min(MAX_X, -(-most // (16 * THREADS))))
    return Grid((gx, min(len(rows), 65535), 1), (THREADS, 1, 1))


def _is_cupy(a: Any) -> bool:
    return type(a).__module__.startswith("cupy") and hasattr(a, "__cuda_array_interface__")


@functools.cache
def _kernel() -> Any:
    """The kernel (compiled on first use, once per process)."""
    import cupy

    return cupy.RawModule(code=SOURCE, options=("--std=c++17",)).get_function(
        "reshard_boxes")


class BoxBatch:
    """Box copies of cupy arrays collected for one launch (:meth:`flush`); the caller
    flushes before anything reads what they write (before a step's operations are
    issued, after its unpacks)."""

    __slots__ = ("_table", "rows")

    def __init__(self) -> None:
        self.rows: list[tuple[int, ...]] = []
        self._table: Any = None  # the last launch's table, alive until the next one

    def add(self, dst: Any, src: Any) -> bool:
        """Queue ``dst[...] = src``; False (nothing queued) where these are not cupy
        arrays of one shape and dtype that :func:`table_rows` covers."""
        if not (_is_cupy(dst) and _is_cupy(src)) or dst.dtype != src.dtype \
                or dst.shape != src.shape:
            return False
        got = table_rows(dst.data.ptr, dst.strides, src.data.ptr, src.strides, dst.shape,
                         dst.itemsize)
        if got is None:
            return False
        self.rows += got
        return True

    def flush(self) -> None:
        """Run the queued copies (one launch on the current stream) and empty the queue."""
        if not self.rows:
            return
        import cupy

        rows, self.rows = self.rows, []
        self._table = cupy.asarray(np.array(rows, dtype=np.int64))
        go = boxes_grid(rows)
        _kernel()(go.grid, go.block, (self._table, np.int64(len(rows))))


__all__ = ["BOX_COMMON", "ROW", "SOURCE", "BoxBatch", "Grid", "boxes_grid", "table_rows"]

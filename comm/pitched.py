"""Copying one strided view into another as 2-D pitched copies (``cudaMemcpy2DAsync``).

A box of a shard that is not one run of memory is rows of equal length at a constant
pitch (most boxes a plan packs: the dimensions after the last one a box cuts are
whole). On a GPU, cupy's assignment of such a view runs an elementwise kernel that
computes every element's address; ``cudaMemcpy2DAsync`` moves the same rows as a
pitched copy at the speed of a contiguous one (microbench/gpu_pack.py measures both
against a plain device-to-device copy of the same bytes).

:func:`pitched_copies` is the geometry (pure: shapes and byte strides in, copies
out); :func:`copy_into` is ``dst[...] = src`` that issues those copies for cupy arrays
on the current stream, and assigns otherwise (numpy, torch, or a view the geometry
does not cover: rows shorter than :data:`MIN_ROW` bytes, more than
:data:`MAX_COPIES` copies, a pitch CUDA refuses).
"""

from __future__ import annotations

from typing import Any, NamedTuple

MIN_ROW = 256
"""Rows shorter than this (bytes) are assigned: a pitched copy moves short rows no
faster than the kernel, and costs a launch per copy."""

MAX_COPIES = 64
"""At most this many pitched copies per view (a box cut in three dimensions is one per
outermost row); beyond, the kernel."""

MAX_PITCH = (1 << 31) - 1
"""The largest pitch ``cudaMemcpy2D`` takes (bytes; cudaDeviceProp.memPitch)."""


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


def _is_cupy(a: Any) -> bool:
    return hasattr(a, "__cuda_array_interface__") and type(a).__module__.startswith("cupy")


def copy_into(dst: Any, src: Any) -> None:
    """``dst[...] = src`` (same shape and dtype): pitched copies on the current stream
    for cupy arrays where :func:`pitched_copies` covers them, else assignment."""
    if not (_is_cupy(dst) and _is_cupy(src)) or dst.dtype != src.dtype \
            or dst.shape != src.shape:
        dst[...] = src
        return
    copies = pitched_copies(tuple(dst.shape), tuple(dst.strides), tuple(src.strides),
                            dst.itemsize)
    if copies is None:
        dst[...] = src
        return
    import cupy

    runtime = cupy.cuda.runtime
    stream = cupy.cuda.get_current_stream().ptr
    d0, s0 = dst.data.ptr, src.data.ptr
    for c in copies:
        runtime.memcpy2DAsync(d0 + c.dst, c.dpitch, s0 + c.src, c.spitch, c.width, c.height,
                              runtime.memcpyDeviceToDevice, stream)


__all__ = ["MAX_COPIES", "MIN_ROW", "Copy", "copy_into", "pitched_copies"]

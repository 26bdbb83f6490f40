"""The fused cast kernels on GPU buffers: cupy arrays (the nccl backend) and torch CUDA
tensors (torch's NCCL ranks), launched through cupy (torch's on torch's current
stream).

Each call is planned first, purely (:func:`plan_amax`, :func:`plan_quantize`,
:func:`plan_scales`, :func:`plan_e8m0`: buffers described by :class:`View` in, a
:class:`Launch` out: the entry point, its grid and its arguments), then run: here on
the GPU, in the tests by the CPU twin of the same source (tests/unit/_cast_twin.py),
so the tests run the very launches the GPU gets. The functions :mod:`reshard.core.casting`
calls (:func:`block_amax`, :func:`quantize_into`, :func:`convert_into`,
:func:`scales_from_amax`, :func:`store_e8m0`) return None / False where the kernels do
not take the case (another dtype, a view of more than three dims that do not merge, no
cupy), and the caller's general path runs.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from reshard.core.dtypes import ScaleMode, is_torch, max_exponent, max_finite
from reshard.core.kernels.cast_geometry import (
    THREADS,
    Geo,
    Grid,
    amax_grid,
    contiguous_strides,
    geometry,
    quantize_grid,
)
from reshard.core.kernels.cast_source import SOURCE

SOURCES = {"bfloat16": "bf16", "float32": "f32"}
"""Source dtypes the kernels read, and their names in the entry points."""

TARGETS = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "bfloat16": "bf16"}
"""Targets they write (bfloat16: from float32, without scales)."""

MODES = {ScaleMode.TENSOR: 1, ScaleMode.BLOCK128: 2, ScaleMode.BLOCK128_UE8M0: 3,
         ScaleMode.MX32: 4}
"""The scale modes' numbers in the source (``M_TENSOR`` ...)."""

_ITEM = {"bf16": 2, "f32": 4, "e4m3": 1, "e5m2": 1}


class View(NamedTuple):
    """A buffer as a kernel sees it: its first element's address, shape, element
    strides and bytes per element."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    itemsize: int


class Launch(NamedTuple):
    """One kernel launch: entry point, grid, and arguments (pointers first, as ints)."""

    kernel: str
    grid: Grid
    pointers: tuple[int, ...]
    ints: tuple[int, ...]


def describe(a: Any) -> View:
    """The :class:`View` of a numpy or cupy array or a torch tensor."""
    if is_torch(a):
        return View(int(a.data_ptr()), tuple(a.shape), tuple(a.stride()), a.element_size())
    item = a.itemsize
    ptr = int(a.__array_interface__["data"][0]) if isinstance(a, np.ndarray) else int(a.data.ptr)
    return View(ptr, tuple(a.shape), tuple(s // item for s in a.strides), item)


def shaped(v: View, shape: tuple[int, ...]) -> View | None:
    """``v`` seen with ``shape``: itself, or a contiguous buffer of as many elements
    (a task's 1-d scratch) as that shape; None otherwise."""
    if v.shape == shape:
        return v
    n = int(np.prod(shape))
    if int(np.prod(v.shape)) == n and v.strides == contiguous_strides(v.shape):
        return View(v.ptr, shape, contiguous_strides(shape), v.itemsize)
    return None


@functools.lru_cache(maxsize=4096)
def _geometry(box: tuple[tuple[int, int], ...], src_strides: tuple[int, ...],
              dst_strides: tuple[int, ...], block: tuple[int, ...], start: tuple[int, ...],
              scale_strides: tuple[int, ...], src_item: int, dst_item: int, src_align: int,
              dst_align: int) -> Geo | None:
    """:func:`geometry` for views starting at addresses of these residues modulo 16 (all
    it reads of them), remembered: a loaded plan casts the same boxes on every run (a
    cache of a pure function, not state)."""
    return geometry(box, src_strides, dst_strides, block, start, scale_strides, src_item,
                    dst_item, src_align, dst_align)


def _geo(box: Sequence[tuple[int, int]], src: View, dst: View, block: Sequence[int],
         start: Sequence[int], scale_strides: Sequence[int]) -> Geo | None:
    return _geometry(tuple((int(a), int(c)) for a, c in box), src.strides, dst.strides,
                     tuple(int(b) for b in block), tuple(int(x) for x in start),
                     tuple(int(x) for x in scale_strides), src.itemsize, dst.itemsize,
                     src.ptr % 16, dst.ptr % 16)


def plan_amax(src: View, kind: str, box: Sequence[tuple[int, int]], block: Sequence[int],
              grid_shape: Sequence[int], out_ptr: int) -> Launch | None:
    """The block amax of ``box`` (``src``, of source kind ``kind``) into a zeroed
    float32 array of ``grid_shape`` at ``out_ptr``."""
    geo = _geo(box, src, src, block, [0] * len(box), contiguous_strides(grid_shape))
    if geo is None:
        return None
    return Launch(f"reshard_amax_{kind}_v{geo.vec}", amax_grid(geo), (out_ptr, src.ptr),
                  geo.args())


def plan_quantize(dst: View, src: View, kind: str, target: str,
                  box: Sequence[tuple[int, int]], block: Sequence[int] | None = None,
                  scales: View | None = None,
                  scales_box: Sequence[tuple[int, int]] | None = None) -> Launch | None:
    """``dst = encode(clip(src / scale))`` (no scales: ``encode(clip(src))``) for the
    elements of ``box``, ``dst`` and ``src`` of its shape; ``scales`` holds the blocks
    of ``scales_box``."""
    t = TARGETS.get(target)
    if t is None or (t == "bf16" and (kind != "f32" or scales is not None)):
        return None
    if scales is None:
        block, start, sst = [1] * len(box), [0] * len(box), [0] * len(box)
    else:
        assert block is not None and scales_box is not None
        start, sst = [a for a, _ in scales_box], list(scales.strides)
    geo = _geo(box, src, dst, block, start, sst)
    if geo is None:
        return None
    s = "s" if scales is not None else "n"
    return Launch(f"reshard_quantize_{kind}_{t}_{s}_v{geo.vec}", quantize_grid(geo),
                  (dst.ptr, src.ptr, 0 if scales is None else scales.ptr), geo.args())


def _flat_grid(n: int) -> Grid:
    return Grid((max(1, min(-(-n // THREADS), 4096)), 1, 1), (THREADS, 1, 1))


def plan_scales(amax_ptr: int, n: int, out_ptr: int, codes_ptr: int, target: str,
                mode: ScaleMode) -> Launch:
    """The scales (float32 values at ``out_ptr``; E8M0 codes at ``codes_ptr`` unless 0)
    of ``n`` contiguous float32 amaxes."""
    top = int(np.float32(max_finite(target)).view(np.uint32))
    return Launch("reshard_scales", _flat_grid(n), (out_ptr, codes_ptr, amax_ptr),
                  (n, MODES[mode], top, max_exponent(target)))


def plan_e8m0(out_ptr: int, in_ptr: int, n: int) -> Launch:
    """E8M0 codes of ``n`` contiguous float32 values."""
    return Launch("reshard_e8m0", _flat_grid(n), (out_ptr, in_ptr), (n,))


# ----- on the GPU ----------------------------------------------------------------------
def on_gpu(a: Any) -> bool:
    """True for a cupy array or a torch CUDA tensor."""
    if is_torch(a):
        return bool(getattr(a, "is_cuda", False))
    return type(a).__module__.startswith("cupy") and hasattr(a, "__cuda_array_interface__")


def source_kind(a: Any, dtype: str | None) -> str | None:
    """The kernels' name of the dtype ``a`` holds (``dtype``, else its own), or None."""
    name = dtype if dtype is not None else str(a.dtype).removeprefix("torch.")
    return SOURCES.get(name)


def _dtype_name(a: Any) -> str:
    return str(a.dtype).removeprefix("torch.")


@functools.cache
def _module() -> Any:
    """The kernels' cupy module (compiled on first use, once per process)."""
    import cupy

    return cupy.RawModule(code=SOURCE, options=("--std=c++17",))


@functools.cache
def usable() -> bool:
    """True where cupy is importable (the kernels launch through it)."""
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


class Runner(Protocol):
    """Where launches run and their outputs live: the GPU (:data:`GPU`), or the tests'
    CPU twin."""

    def accepts(self, *arrays: Any) -> bool:
        """True if every one of ``arrays`` is memory this runner's kernels reach."""
        ...

    def zeros(self, like: Any, shape: tuple[int, ...]) -> Any:
        """A float32 array of zeros beside ``like``."""
        ...

    def empty(self, like: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised array of ``dtype`` beside ``like``."""
        ...

    def contiguous(self, a: Any) -> Any:
        """``a`` as a C-contiguous array (itself if it is one)."""
        ...

    def run(self, go: Launch, like: Any) -> None:
        """Launch ``go`` where ``like``'s work is ordered."""
        ...


class GpuRunner:
    """Launches through cupy: on cupy's current stream for cupy arrays, on torch's
    current stream (of the tensor's device) for torch tensors."""

    def accepts(self, *arrays: Any) -> bool:
        """cupy arrays or torch CUDA tensors, with cupy importable."""
        return usable() and all(on_gpu(a) for a in arrays)

    def zeros(self, like: Any, shape: tuple[int, ...]) -> Any:
        """Zeros (float32) on ``like``'s device, by its library."""
        if is_torch(like):
            import torch

            return torch.zeros(shape, dtype=torch.float32, device=like.device)
        import cupy

        return cupy.zeros(shape, dtype=np.float32)

    def empty(self, like: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        """An array of ``dtype`` on ``like``'s device, by its library."""
        if is_torch(like):
            import torch

            return torch.empty(shape, dtype=dtype, device=like.device)
        import cupy

        return cupy.empty(shape, dtype=dtype)

    def contiguous(self, a: Any) -> Any:
        """A C-contiguous copy of ``a`` on its device (itself if it is one)."""
        if is_torch(a):
            return a.contiguous()
        import cupy

        return cupy.ascontiguousarray(a)

    def run(self, go: Launch, like: Any) -> None:
        """The launch, on the stream ``like`` is used on."""
        import cupy

        args = tuple(np.uint64(p) for p in go.pointers) + tuple(np.int64(i) for i in go.ints)
        kernel = _module().get_function(go.kernel)
        if is_torch(like):
            import torch

            dev = like.device.index
            dev = torch.cuda.current_device() if dev is None else dev
            with cupy.cuda.Device(dev), cupy.cuda.ExternalStream(
                    torch.cuda.current_stream(dev).cuda_stream):
                kernel(go.grid.grid, go.grid.block, args)
            return
        kernel(go.grid.grid, go.grid.block, args)


GPU = GpuRunner()
"""The runner :mod:`reshard.core.casting` uses (stateless)."""


def block_amax(values: Any, box: Sequence[tuple[int, int]], block: Sequence[int],
               grid: Sequence[int], dtype: str | None, runner: Runner = GPU) -> Any:
    """:func:`reshard.core.casting.block_amax` in one kernel (None: not taken)."""
    kind = source_kind(values, dtype)
    if kind is None or not runner.accepts(values):
        return None
    shape = tuple(int(g) for g in grid)
    src = describe(values)
    go = plan_amax(src, kind, box, block, shape, 0)
    if go is None:
        return None
    out = runner.zeros(values, shape)
    runner.run(go._replace(pointers=(describe(out).ptr, src.ptr)), values)
    return out


def quantize_into(out: Any, values: Any, box: Sequence[tuple[int, int]],
                  block: Sequence[int], scales: Any, scales_box: Sequence[tuple[int, int]],
                  target: str, dtype: str | None, runner: Runner = GPU) -> bool:
    """:func:`reshard.core.casting.quantize_into` in one kernel (False: not taken)."""
    kind = source_kind(values, dtype)
    if kind is None or not runner.accepts(out, values, scales) \
            or _dtype_name(scales) != "float32":
        return False
    src = describe(values)
    dst = shaped(describe(out), src.shape)
    if dst is None:
        return False
    go = plan_quantize(dst, src, kind, target, box, block, describe(scales), scales_box)
    if go is None:
        return False
    runner.run(go, out)
    return True


def convert_into(out: Any, values: Any, target: str, dtype: str | None,
                 runner: Runner = GPU) -> bool:
    """:func:`reshard.core.casting.convert_into` to float8 (or float32 to bfloat16) in one
    kernel (False: not taken)."""
    kind = source_kind(values, dtype)
    if kind is None or not runner.accepts(out, values) or not all(values.shape):
        return False
    src = describe(values)
    dst = shaped(describe(out), src.shape)
    if dst is None or not src.shape:
        return False
    go = plan_quantize(dst, src, kind, target, tuple((0, n) for n in src.shape))
    if go is None:
        return False
    runner.run(go, out)
    return True


def scales_from_amax(amax: Any, target: str, mode: ScaleMode, codes: Any = None,
                     runner: Runner = GPU) -> Any:
    """:func:`reshard.core.casting.scales_from_amax` in one kernel (None: not taken); with
    ``codes`` (a contiguous uint8 or E8M0 buffer of as many elements), their E8M0 codes
    too."""
    if mode not in MODES or target not in ("float8_e4m3fn", "float8_e5m2") \
            or not runner.accepts(amax) or _dtype_name(amax) != "float32":
        return None
    a = describe(amax)
    if a.strides != contiguous_strides(a.shape):  # a box of a grid: its blocks alone
        amax = runner.contiguous(amax)
        a = describe(amax)
    out = runner.empty(amax, a.shape, amax.dtype)
    n = int(np.prod(a.shape))
    if n:
        runner.run(plan_scales(a.ptr, n, describe(out).ptr,
                               0 if codes is None else describe(codes).ptr, target, mode),
                   amax)
    return out


def store_e8m0(out: Any, scales: Any, runner: Runner = GPU) -> bool:
    """``out[...] = scales`` as E8M0 codes in one kernel (False: not taken)."""
    if not runner.accepts(out, scales):
        return False
    s, o = describe(scales), describe(out)
    n = int(np.prod(s.shape))
    if o.itemsize != 1 or int(np.prod(o.shape)) != n or s.itemsize != 4 \
            or s.strides != contiguous_strides(s.shape) or o.strides != contiguous_strides(o.shape):
        return False
    if n:
        runner.run(plan_e8m0(o.ptr, s.ptr, n), out)
    return True


__all__ = ["GPU", "MODES", "SOURCES", "TARGETS", "GpuRunner", "Launch", "Runner", "View",
           "block_amax", "convert_into", "describe", "on_gpu", "plan_amax", "plan_e8m0",
           "plan_quantize", "plan_scales", "quantize_into", "scales_from_amax", "shaped",
           "source_kind", "store_e8m0"]

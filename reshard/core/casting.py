"""Cast kernels: converting, measuring and scaling values as they are packed, and the
numpy reference every test compares against.

The semantics are :mod:`reshard.core.dtypes`'s; this module computes them on the buffers
of any backend: numpy arrays (ml_dtypes' types included), torch tensors (torch's own
bfloat16 and float8 types) and cupy arrays (the dtypes cupy has). An executor packing
a box calls the same functions the reference applies to the whole tensor, so the
sharded result equals the reference bit for bit: a block's amax is a max (exact in
any order), and every other step is elementwise.

* :func:`convert_into`: ``out[...] = values`` in ``out``'s dtype, saturating to a
  float8 type's finite range (through float32).
* :func:`block_amax`: the max ``|x|`` per scale block over the elements of a box (the
  partial amax one device contributes; zeros for blocks outside the box).
* :func:`scales_from_amax`: ``amax / max_finite`` in float32, 1 for an all-zero block,
  or the power of two of the E8M0 modes (``block128-ue8m0``, ``mx32``);
  :func:`stored_scales` holds those in the scales tensor's dtype (float8_e8m0fnu).
* :func:`quantize_into`: ``out[...] = saturate(values / scales)``, each element divided
  by the scale of its block, in float32.
* :func:`reference_cast`: the whole tensor through the three (values and scales).

On a GPU (cupy arrays, torch CUDA tensors) the same functions run the fused kernels of
:mod:`reshard.core.kernels.cast_launch` where they take the case (bfloat16 or float32 read,
float8 or bfloat16 written): the block amax one pass over the data, the scales one
launch over the blocks, the quantize and encode another pass; elsewhere (numpy, CPU
torch, other dtypes) the array library's own operations. Both are exact: torch divides
by tensors here, never by a Python number (which CUDA would multiply by its rounded
reciprocal, one ulp off the reference's quotient).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from reshard.core.bits import array_module, as_float32, assign, store
from reshard.core.dtypes import (
    Cast,
    ScaleMode,
    block_shape,
    is_float8,
    is_torch,
    max_exponent,
    max_finite,
    parse_dtype,
    scale_grid,
)
from reshard.core.kernels import cast_launch as fused
from reshard.core.layout import Box


def _clip(a: Any, bound: float) -> Any:
    """Clip float32 ``a`` to ``[-bound, bound]`` in place (NaN stays NaN)."""
    if is_torch(a):
        return a.clamp_(-bound, bound)
    return array_module(a).clip(a, -bound, bound, out=a)


def _amax_along(a: Any, axis: int) -> Any:
    if is_torch(a):
        return a.amax(dim=axis, keepdim=True)
    return a.max(axis=axis, keepdims=True)


def _concat(parts: list[Any], axis: int) -> Any:
    if len(parts) == 1:
        return parts[0]
    if is_torch(parts[0]):
        import torch

        return torch.cat(parts, dim=axis)
    return array_module(parts[0]).concatenate(parts, axis=axis)


def _take(a: Any, axis: int, start: int, stop: int) -> Any:
    index = [slice(None)] * a.ndim
    index[axis] = slice(start, stop)
    return a[tuple(index)]


def _segment_max(a: Any, axis: int, lo: int, b: int) -> Any:
    """Max of ``a`` over the segments of ``axis`` that blocks of ``b`` cut, where
    ``a``'s first element along ``axis`` is global index ``lo``."""
    n = a.shape[axis]
    head = min(n, (-lo) % b)
    body = (n - head) // b * b
    parts = []
    if head:
        parts.append(_amax_along(_take(a, axis, 0, head), axis))
    if body:
        mid = _take(a, axis, head, head + body)
        shape = (*mid.shape[:axis], body // b, b, *mid.shape[axis + 1:])
        parts.append(_amax_along(mid.reshape(shape), axis + 1).reshape(
            (*mid.shape[:axis], body // b, *mid.shape[axis + 1:])))
    if head + body < n:
        parts.append(_amax_along(_take(a, axis, head + body, n), axis))
    return _concat(parts, axis)


def _zeros_like_grid(a: Any, grid: Sequence[int]) -> Any:
    if is_torch(a):
        import torch

        return torch.zeros(tuple(grid), dtype=torch.float32, device=a.device)
    return array_module(a).zeros(tuple(grid), dtype=np.float32)


def block_range(box: Box, block: Sequence[int]) -> Box:
    """The blocks (a box of the scale grid) that ``box`` meets."""
    return tuple((a // b, -(-c // b)) if c > a else (a // b, a // b)
                 for (a, c), b in zip(box, block))


def block_amax(values: Any, box: Box, block: Sequence[int], grid: Sequence[int],
               dtype: str | None = None) -> Any:
    """Per scale block, the max ``|x|`` over the elements of ``box`` (``values`` holds
    them, of ``dtype`` as the type or its bits; None: its own dtype): a float32 array of
    shape ``grid``, zeros for blocks ``box`` does not meet. NaN propagates into its
    block."""
    if all(c > a for a, c in box) and fused.on_gpu(values):
        got = fused.block_amax(values, box, block, grid, dtype)
        if got is not None:
            return got
    out = _zeros_like_grid(values, grid)
    if not all(c > a for a, c in box):
        return out
    mags = as_float32(values, dtype)
    mags = mags.abs() if is_torch(mags) else abs(mags)
    for axis, ((a, _), b) in enumerate(zip(box, block)):
        mags = _segment_max(mags, axis, a, b)
    out[tuple(slice(a, c) for a, c in block_range(box, block))] = mags
    return out


def scales_from_amax(amax: Any, target: str, mode: ScaleMode = ScaleMode.BLOCK128) -> Any:
    """The scales (float32 values) of blocks whose max ``|x|`` is ``amax``, cast to
    ``target`` as ``mode`` says (:mod:`reshard.core.dtypes`): ``amax / max_finite(target)``,
    1 where ``amax`` is 0 (``tensor``, ``block128``); the power of two at or above that
    (``block128-ue8m0``); ``2^(floor(log2(amax)) - emax)``, ``2^-127`` where ``amax`` is
    0 (``mx32``). Powers of two are clamped to ``[2^-127, 2^127]``; a NaN or infinite
    amax gives NaN."""
    if fused.on_gpu(amax):
        got = fused.scales_from_amax(amax, target, mode)
        if got is not None:
            return got
    if mode in _POWERS:
        return _powers_of_two(amax, target, mode)
    top = max_finite(target)
    if is_torch(amax):
        import torch

        a = amax.float()
        return torch.where(a > 0, a / torch.full_like(a, top), torch.ones_like(a))
    one = np.float32(1)
    return array_module(amax).where(amax > 0, amax / np.float32(top), one).astype(np.float32)


def _powers_of_two(amax: Any, target: str, mode: ScaleMode) -> Any:
    """:func:`scales_from_amax` for the E8M0 modes. The exponent comes from frexp
    (``x = m 2^e``, ``m`` in ``[0.5, 1)``), exact where a float32 log2 would round:
    ``ceil(log2 x)`` is ``e - 1`` when ``m`` is exactly 0.5, else ``e``;
    ``floor(log2 x)`` is ``e - 1``."""
    torch_ = is_torch(amax)
    xp: Any
    if torch_:
        import torch as xp
    else:
        xp = array_module(amax)
    a = amax.float() if torch_ else amax.astype(np.float32)
    if mode is ScaleMode.BLOCK128_UE8M0:
        top = max_finite(target)
        x = a / (xp.full_like(a, top) if torch_ else np.float32(top))
        m, e = xp.frexp(x)
        k = xp.where(m == 0.5, e - 1, e)
        zero = 0  # an all-zero block: scale 1
    else:  # MX32
        m, e = xp.frexp(a)
        k = e - 1 - max_exponent(target)
        zero = -127  # an all-zero block: 2^-127, E8M0's least
    k = xp.where(a > 0, k, zero)
    k = k.clamp(-127, 127) if torch_ else xp.clip(k, -127, 127)
    if torch_:  # 2^k, exact down to 2^-127 (a float32 subnormal)
        out = xp.ldexp(xp.ones_like(a), k.to(xp.float32))
    else:
        out = xp.ldexp(xp.ones_like(a), k.astype(np.int32))
    bad = ~xp.isfinite(a)
    return xp.where(bad, xp.full_like(a, float("nan")), out)


_POWERS = frozenset({ScaleMode.BLOCK128_UE8M0, ScaleMode.MX32})


def stored_scales(scales: Any, mode: ScaleMode, like: Any = None) -> Any:
    """Float32 ``scales`` as ``mode``'s scales tensor holds them
    (:attr:`ScaleMode.scale_dtype`: float32, or float8_e8m0fnu, exact for the powers of
    two :func:`scales_from_amax` gives; NaN is E8M0's NaN): numpy an ml_dtypes array,
    torch its own dtype, cupy the bits. ``like``: an empty array of the scale dtype as
    the backend holds it (None: numpy or torch, as ``scales``)."""
    name = mode.scale_dtype
    if name == "float32":
        return scales
    if like is None:
        if is_torch(scales):
            import torch

            return scales.to(getattr(torch, name))
        return np.asarray(scales).astype(parse_dtype(name))
    out = like.reshape(tuple(scales.shape)) if like.size == scales.size else like
    if not (fused.on_gpu(out) and fused.store_e8m0(out, scales)):
        store(out, scales, name)
    return out


def _scale_of_elements(scales: Any, scales_box: Box, box: Box,
                       block: Sequence[int]) -> Any:
    """The scale of every element of ``box`` (broadcastable to its shape), from
    ``scales`` holding the blocks of ``scales_box``."""
    torch_ = is_torch(scales)
    if torch_:
        import torch
    index = []
    ndim = len(box)
    for axis, ((a, c), b, (s0, _)) in enumerate(zip(box, block, scales_box)):
        shape = [1] * ndim
        if c - a and (a // b) == ((c - 1) // b):  # one block along this dim: broadcast
            idx = np.array([a // b - s0], dtype=np.int64)
        else:
            idx = np.arange(a, c, dtype=np.int64) // b - s0
            shape[axis] = c - a
        if torch_:
            index.append(torch.from_numpy(idx).to(scales.device).reshape(shape))
        else:
            index.append(array_module(scales).asarray(idx).reshape(shape))
    return scales[tuple(index)] if ndim else scales


def quantize_into(out: Any, values: Any, box: Box, block: Sequence[int], scales: Any,
                  scales_box: Box, target: str, dtype: str | None = None) -> None:
    """``out[...] = saturate(values / scale of each element's block)`` in float32,
    rounded to ``out``'s dtype (``target``). ``values`` holds ``box`` (of ``dtype``, as
    the type or its bits; None: its own dtype); ``scales`` (float32 values) the blocks
    of ``scales_box`` (a box of the scale grid containing ``box``'s blocks)."""
    if not all(c > a for a, c in box):
        return
    if fused.on_gpu(out) and fused.quantize_into(out, values, box, block, scales, scales_box,
                                                 target, dtype):
        return
    v = as_float32(values, dtype)
    s = _scale_of_elements(scales, scales_box, box, block)
    if is_torch(v):
        v.div_(s)
    else:
        array_module(v).divide(v, s, out=v)
    store(out, _clip(v, max_finite(target)), target)


def convert_into(out: Any, values: Any, target: str, dtype: str | None = None) -> None:
    """``out[...] = values`` converted to ``out``'s dtype (``target``): round to
    nearest even; into a float8 type through float32, saturating to its finite
    range. ``values`` is of ``dtype`` (None: its own); either array may hold its dtype
    as its bits (:mod:`reshard.core.bits`)."""
    if fused.on_gpu(out) and fused.convert_into(out, values, target, dtype):
        return
    if is_float8(target):
        store(out, _clip(as_float32(values, dtype), max_finite(target)), target)
    elif dtype is not None:
        assign(out, target, values, dtype)
    else:
        out[...] = values.reshape(tuple(out.shape))


def cast_whole(x: Any, cast: Cast, empty: Callable[[tuple[int, ...], str], Any] | None = None,
               source: str | None = None, *, stored: bool = True) -> tuple[Any, Any]:
    """``x`` (a whole tensor: numpy, cupy or torch, of ``source`` as its type or bits;
    None: its own dtype) converted as ``cast`` says, by the steps a backend runs on a
    box (block amax, scales, quantize; or one conversion), and its scales (None without
    scales; float32 if ``stored`` is false, else in the scale dtype).
    ``empty(shape, dtype name)`` allocates the outputs beside ``x`` (None: numpy)."""
    shape = tuple(int(n) for n in x.shape)
    out = np.empty(shape, parse_dtype(cast.dtype)) if empty is None else empty(shape, cast.dtype)
    if cast.scale is ScaleMode.NONE:
        convert_into(out, x, cast.dtype, source)
        return out, None
    box = tuple((0, n) for n in shape)
    block = block_shape(shape, cast.scale, cast.fold)
    grid = scale_grid(shape, cast.scale, cast.fold)
    scales = scales_from_amax(block_amax(x, box, block, grid, source), cast.dtype, cast.scale)
    quantize_into(out, x, box, block, scales, tuple((0, g) for g in grid), cast.dtype, source)
    if cast.scale.scale_dtype == "float32" or not stored:
        return out, scales
    like = None if empty is None else empty(grid, cast.scale.scale_dtype)
    return out, stored_scales(scales, cast.scale, like)


def reference_cast(x: np.ndarray, cast: Cast) -> tuple[np.ndarray, np.ndarray | None]:
    """The reference of a cast on the wire: ``x`` (a whole numpy tensor) converted as
    ``cast`` says, and its scales (None without scales). What every test compares a
    reshard's destination shards (and delivered scales) with."""
    return cast_whole(x, cast)


__all__ = ["block_amax", "block_range", "cast_whole", "convert_into", "quantize_into", "reference_cast",
           "scales_from_amax"]

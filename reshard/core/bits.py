"""bfloat16 and float8 as their bits: converting to and from float32 with integer
arithmetic, for array libraries that lack those types (cupy).

A backend whose array library has no bfloat16 or float8 holds such buffers as unsigned
integers of the same width (:func:`reshard.core.dtypes.storage`, ``Capabilities.bits``).
To cast on the wire, sum a bfloat16 partial sum in float32, or measure a block's amax,
it reads them as float32 (:func:`decode`) and writes float32 results back as bits
(:func:`encode_into`). Both use only elementwise operations that numpy and cupy share
(views, shifts, ``where``, ``rint``, a 256-entry table), so they run on the GPU where
the buffers live, and are checked bit for bit against ml_dtypes' own conversions on
numpy arrays (tests/unit/test_bits.py).

Rounding is to nearest, ties to even, as ml_dtypes (and CUDA's ``__float2bfloat16_rn``
/ ``__nv_cvt_float_to_fp8`` with ``__NV_NOSAT``) round: a float32 too large for the
type becomes its infinity (bfloat16, float8_e5m2) or NaN (float8_e4m3fn, which has no
infinity); NaN stays NaN with its sign.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from reshard.core.dtypes import NARROW, is_torch, parse_dtype


@dataclass(frozen=True)
class _Float8:
    """A float8 kind's layout: exponent bias, mantissa bits, the first code past its
    largest finite value (what overflow becomes) and its NaN code (sign bit clear)."""

    bias: int
    mantissa: int
    overflow: int
    nan: int


_FLOAT8 = {
    "float8_e4m3fn": _Float8(bias=7, mantissa=3, overflow=0x7F, nan=0x7F),
    "float8_e5m2": _Float8(bias=15, mantissa=2, overflow=0x7C, nan=0x7E),
}


def holds_bits(a: Any, name: str) -> bool:
    """True if array ``a`` holds dtype ``name`` as its bits (an unsigned integer array
    of a library without the type), not as the type itself."""
    return name in NARROW and not is_torch(a) and np.dtype(a.dtype) != parse_dtype(name)


def array_module(a: Any) -> Any:
    """The array module (numpy or cupy) of a numpy or cupy array."""
    if isinstance(a, np.ndarray):
        return np
    import cupy  # only reached with cupy arrays

    return cupy


def decode(bits: Any, name: str) -> Any:
    """A new float32 array of the values whose ``name`` bits ``bits`` holds (exact:
    every bfloat16 and float8 value is a float32)."""
    xp = array_module(bits)
    if name == "bfloat16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    if name in _FLOAT8 or name == E8M0:
        table = np.arange(256, dtype=np.uint8).view(parse_dtype(name)).astype(np.float32)
        return xp.asarray(table)[bits.astype(np.intp)]
    raise ValueError(f"{name} is not held as bits")


E8M0 = "float8_e8m0fnu"
"""The scale type of the power-of-two scale modes: 8 exponent bits, no sign, no
mantissa; code ``c`` is ``2^(c - 127)``, 255 is NaN (there is no zero)."""


def _e8m0(v: Any, xp: Any) -> Any:
    """E8M0 codes of float32 ``v`` as ml_dtypes rounds: the exponent of a normal float32
    with its mantissa rounded half up; below ``2^-126`` (float32 subnormals) code 0 up
    to ``2^-127`` and 1 above it; NaN, zero, negatives and overflow 255."""
    u = v.view(np.uint32).astype(np.int64)
    normal = (u + (1 << 22)) >> 23  # rounds 1.5 * 2^k up to 2^(k + 1)
    tiny = u < (1 << 23)  # float32 subnormals: 2^-127 is half the least normal
    code = xp.where(tiny, xp.where(u > (1 << 22), 1, 0), normal)
    bad = xp.isnan(v) | (v <= 0) | (code > 254)
    return xp.where(bad, 255, code).astype(np.uint8)


def _bfloat16(v: Any, xp: Any) -> Any:
    u = v.view(np.uint32)
    lsb = (u >> np.uint32(16)) & np.uint32(1)
    rounded = (u + (np.uint32(0x7FFF) + lsb)) >> np.uint32(16)  # wraps nowhere: < 2^32
    quiet = ((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0)  # ml_dtypes' NaN
    return xp.where(xp.isnan(v), quiet, rounded).astype(np.uint16)


def _float8(v: Any, kind: _Float8, xp: Any) -> Any:
    u = v.view(np.uint32)
    sign = ((u >> np.uint32(24)) & np.uint32(0x80)).astype(np.uint8)
    mag = (u & np.uint32(0x7FFFFFFF)).astype(np.int64)
    shift = 23 - kind.mantissa
    # normal in the target: re-bias the exponent, round the mantissa to `mantissa` bits
    # (a carry moves into the exponent, as it should)
    t = mag - ((127 - kind.bias) << 23)
    normal = (t + ((1 << (shift - 1)) - 1) + ((t >> shift) & 1)) >> shift
    # subnormal in the target: a multiple of its smallest step, rounded half to even
    # (reaching 2^mantissa is the smallest normal, whose code is that number)
    tiny = mag < ((128 - kind.bias) << 23)  # below the smallest normal, 2^(1 - bias)
    small = xp.rint(xp.where(tiny, xp.abs(v), np.float32(0))
                    * np.float32(2.0 ** (kind.bias - 1 + kind.mantissa)))
    code = xp.where(tiny, small.astype(np.int64), xp.minimum(normal, kind.overflow))
    code = xp.where(xp.isnan(v), kind.nan, code)
    return code.astype(np.uint8) | sign


def encode_into(out: Any, values: Any, name: str) -> None:
    """``out[...] = values`` (float32, broadcastable to ``out``) as ``name``'s bits,
    rounded to nearest even; ``out`` holds ``name`` as bits (:func:`holds_bits`)."""
    xp = array_module(out)
    v = xp.ascontiguousarray(xp.broadcast_to(values, tuple(out.shape)), dtype=np.float32)
    if name == "bfloat16":
        out[...] = _bfloat16(v, xp)
    elif name in _FLOAT8:
        out[...] = _float8(v, _FLOAT8[name], xp)
    elif name == E8M0:
        out[...] = _e8m0(v, xp)
    else:
        raise ValueError(f"{name} is not held as bits")


def as_float32(a: Any, name: str | None = None) -> Any:
    """A new float32 array of ``a``'s values (numpy, cupy or torch), ``a`` holding dtype
    ``name`` as the type or as its bits (None: its own dtype)."""
    if name is not None and holds_bits(a, name):
        return decode(a, name)
    if is_torch(a):
        import torch

        return a.to(torch.float32, copy=True)
    return a.astype(np.float32)


def store(out: Any, values: Any, name: str) -> None:
    """``out[...] = values`` (float32, ``out``'s shape or its size) in ``out``'s dtype
    ``name``, held as the type or as its bits."""
    if holds_bits(out, name):
        encode_into(out, values.reshape(tuple(out.shape)), name)
    else:
        out[...] = values.reshape(tuple(out.shape))


def assign(out: Any, out_dtype: str, values: Any, dtype: str) -> None:
    """``out[...] = values`` converted from dtype ``dtype`` to ``out_dtype``, either
    array holding its dtype as the type or as its bits. Conversions the library has
    are its own; bits go through float32 (exact for a widening, one rounding for a
    narrowing: the value the library's own conversion would give)."""
    if holds_bits(out, out_dtype) or holds_bits(values, dtype):
        values = as_float32(values, dtype)
    store(out, values, out_dtype)


__all__ = ["array_module", "as_float32", "assign", "decode", "encode_into", "holds_bits",
           "store"]

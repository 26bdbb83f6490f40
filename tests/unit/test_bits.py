"""reshard.bits against ml_dtypes' own conversions: every bfloat16 and float8 code
decoded, and float32 values of every kind (random bit patterns: NaN payloads,
infinities, subnormals; ties; values beyond each type's range) encoded bit for bit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from reshard.bits import as_float32, assign, decode, encode_into, holds_bits
from reshard.dtypes import parse_dtype, storage

NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def _bits(a: np.ndarray, name: str) -> np.ndarray:
    return a.view(parse_dtype(storage(name)))


def _edges(name: str) -> np.ndarray:
    """Values at and around each type's landmarks: its largest finite value and the
    midpoint past it, the smallest normal and subnormal and the ties between them."""
    info = ml_dtypes.finfo(getattr(ml_dtypes, name))
    top, tiny, sub = float(info.max), float(info.smallest_normal), float(info.smallest_subnormal)
    codes = np.arange(256, dtype=np.uint8).view(parse_dtype(name)).astype(np.float32) \
        if name != "bfloat16" else np.arange(1 << 16, dtype=np.uint16).view(
            parse_dtype(name)).astype(np.float32)
    finite = codes[np.isfinite(codes)]
    mids = (finite[:-1].astype(np.float64) + np.sort(finite)[1:]) / 2  # ties (some)
    marks = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, top, top * 1.03, top * 1.2,
             tiny, tiny * 0.999, tiny * 1.001, sub, sub / 2, sub * 1.5, sub * 2.5, 1e30]
    vals = np.concatenate([np.array(marks), mids, finite]).astype(np.float32)
    return np.concatenate([vals, -vals])


@pytest.mark.parametrize("name", NAMES)
def test_encode_matches_ml_dtypes(name):
    rng = np.random.default_rng(len(name))
    patterns = rng.integers(0, 1 << 32, size=400_000, dtype=np.uint64).astype(np.uint32)
    values = np.concatenate([patterns.view(np.float32), _edges(name),
                             rng.standard_normal(100_000).astype(np.float32) * 300,
                             rng.standard_normal(100_000).astype(np.float32) * 2e-3])
    with np.errstate(invalid="ignore", over="ignore"):  # ml_dtypes' NaN / inf casts
        want = _bits(values.astype(parse_dtype(name)), name)
    out = np.empty(values.shape, want.dtype)
    encode_into(out, values, name)
    bad = np.flatnonzero(out != want)
    assert bad.size == 0, (name, values[bad[:5]], out[bad[:5]], want[bad[:5]])


@pytest.mark.parametrize("name", NAMES)
def test_decode_every_code(name):
    codes = np.arange(1 << (8 * parse_dtype(name).itemsize)).astype(storage(name))
    got = decode(codes, name)
    want = codes.view(parse_dtype(name)).astype(np.float32)
    assert got.dtype == np.float32
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))  # -0 too


def test_assign_between_types_and_bits():
    """Every pairing of the type and its bits, either side, gives ml_dtypes' result."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((7, 9)) * 40).astype(np.float32)
    bf = x.astype(ml_dtypes.bfloat16)
    assert holds_bits(_bits(bf, "bfloat16"), "bfloat16") and not holds_bits(bf, "bfloat16")
    assert not holds_bits(x, "float32")
    for src, src_name in ((x, "float32"), (bf, "bfloat16"), (_bits(bf, "bfloat16"), "bfloat16")):
        for target in ("float32", "bfloat16", "float8_e4m3fn", "float16"):
            want = np.asarray(src.view(bf.dtype) if src.dtype == np.uint16 else src).astype(
                parse_dtype(target))
            for holds in ("type", "bits"):
                out = np.empty(x.shape, parse_dtype(target))
                if holds == "bits":
                    out = _bits(out, target)
                assign(out, target, src, src_name)
                assert out.tobytes() == want.tobytes(), (src_name, target, holds)
    np.testing.assert_array_equal(as_float32(_bits(bf, "bfloat16"), "bfloat16"),
                                  bf.astype(np.float32))
    with pytest.raises(ValueError, match="not held as bits"):
        decode(x, "float32")

"""The power-of-two fp8 scale formats engines take: ``block128-ue8m0`` (DeepGEMM /
SGLang on Blackwell: per 128 x 128 block ``2^ceil(log2(amax / 448))`` as E8M0) and
``mx32`` (MXFP8, OCP Microscaling v1.0: per 32 elements of the last dim
``2^(floor(log2(amax)) - emax)`` as E8M0). The reference (reshard.casting) against
torchao's MX implementation and an independent torch transcription of DeepGEMM's
recipe, the spec's worked cases, E8M0's bits, the refusals, and the wire bytes the
model counts."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.bits import decode, encode_into
from reshard.casting import reference_cast, scales_from_amax
from reshard.dtypes import Cast, ScaleMode, scale_grid
from reshard.errors import DTypeError

E8M0 = ml_dtypes.float8_e8m0fnu
UE8M0 = ScaleMode.BLOCK128_UE8M0
MX = ScaleMode.MX32


def _values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Normal values with a magnitude of its own per row (2^-40 .. 2^40), an all-zero
    row and an all-zero first block."""
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-28, 28, (*shape[:-1], 1)))
    x = x.astype(np.float32)
    x[..., 0, :] = 0
    if shape[-2] > 1:
        x[..., 1, :32] = 0
    return x


def test_the_worked_cases():
    """The formulas on amaxes where they are easy to state, both formats, both fp8
    kinds: a power of two stays itself, one ulp above it goes up (UE8M0's ceil; a
    float32 log2 would round it down), the zero block's scale, clamping."""
    def ue8m0(a, target="float8_e4m3fn"):
        return scales_from_amax(np.array([a], np.float32), target, UE8M0)[0]

    def mx(a, target="float8_e4m3fn"):
        return scales_from_amax(np.array([a], np.float32), target, MX)[0]

    above = float(np.nextafter(np.float32(448), np.float32(1e9)))
    assert ue8m0(448.0) == 1.0 and ue8m0(above) == 2.0 and ue8m0(449.0) == 2.0
    assert ue8m0(56.0) == 0.125 and ue8m0(1.0) == 2.0 ** -8  # 1/448 -> 2^-8
    assert ue8m0(0.0) == 1.0  # an all-zero block
    assert ue8m0(57344.0, "float8_e5m2") == 1.0
    assert math.isnan(ue8m0(float("nan"))) and math.isnan(ue8m0(float("inf")))
    assert mx(1.0) == 2.0 ** -8 and mx(448.0) == 1.0 and mx(511.0) == 1.0 and mx(512.0) == 2.0
    assert mx(1.0, "float8_e5m2") == 2.0 ** -15
    assert mx(0.0) == 2.0 ** -127 and mx(2.0 ** -140) == 2.0 ** -127  # clamped
    assert mx(3e38) == 2.0 ** (127 - 8)
    # MX: x / X lies in [256, 512) for the block's largest, which saturates to 448
    q, s = reference_cast(np.array([[500.0, -1.0, 0.0]], np.float32), Cast("float8_e4m3fn", MX))
    assert s.dtype == E8M0 and s.view(np.uint8).tolist() == [[127]]  # 2^0
    assert q.astype(np.float32).tolist() == [[448.0, -1.0, 0.0]]


def test_e8m0_bits_match_ml_dtypes():
    """Buffers of libraries without E8M0 (cupy) hold its bits: decode and encode equal
    ml_dtypes' own conversion on every code and on float32 values of every kind."""
    codes = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(decode(codes, "float8_e8m0fnu"),
                                  codes.view(E8M0).astype(np.float32))
    rng = np.random.default_rng(0)
    values = np.concatenate([
        np.array([0, -1, np.nan, np.inf, 2.0 ** -127, 2.0 ** -128, 1.5, 3, 2.0 ** 127,
                  3.4e38, 2.0 ** -149], np.float32),
        (rng.standard_normal(50_000) * np.exp(rng.uniform(-88, 88, 50_000))).astype(np.float32),
        np.arange(0, 1 << 32, 65_537, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    out = np.empty(values.shape, np.uint8)
    encode_into(out, values, "float8_e8m0fnu")
    with np.errstate(all="ignore"):
        want = values.astype(E8M0).view(np.uint8)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("target", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("src", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(64, 320), (3, 5, 96), (1024,)])
def test_mx32_equals_torchao(target, src, shape):
    """torchao's MX formats (``to_mx``, the spec's floor scale) give the same E8M0
    scales and fp8 elements bit for bit (whole blocks: a ragged last block is the next
    test's)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    from reshard.dtypes import numpy_of_torch, torch_of_numpy

    x = _values(np.random.default_rng(sum(shape)), shape) if len(shape) > 1 else \
        np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    xs = x.astype(ml_dtypes.bfloat16) if src == "bfloat16" else x
    q, s = reference_cast(xs, Cast(target, MX))
    assert s.dtype == E8M0 and s.shape == scale_grid(shape, MX)
    ts, tq = to_mx(torch_of_numpy(np.ascontiguousarray(xs)), getattr(torch, target), 32)
    np.testing.assert_array_equal(numpy_of_torch(ts).view(np.uint8).reshape(s.shape),
                                  s.view(np.uint8))
    np.testing.assert_array_equal(numpy_of_torch(tq).view(np.uint8).reshape(q.shape),
                                  q.view(np.uint8))


def test_mx32_ragged_last_block_equals_torchao_on_the_padded_tensor():
    """A ragged last block is a block of its own elements: torchao on the tensor padded
    with zeros (which change no amax) gives the same scales and elements."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    from reshard.dtypes import numpy_of_torch

    x = _values(np.random.default_rng(3), (9, 100))
    q, s = reference_cast(x, Cast("float8_e4m3fn", MX))
    padded = np.zeros((9, 128), np.float32)
    padded[:, :100] = x
    ts, tq = to_mx(torch.from_numpy(padded), torch.float8_e4m3fn, 32)
    np.testing.assert_array_equal(numpy_of_torch(ts).view(np.uint8).reshape(9, 4),
                                  s.view(np.uint8))
    np.testing.assert_array_equal(numpy_of_torch(tq).view(np.uint8)[:, :100], q.view(np.uint8))


def _deepgemm_ue8m0(x, torch):
    """DeepGEMM's per-block fp8 cast with UE8M0 scales, transcribed in torch (its
    ``per_block_cast_to_fp8(x, use_ue8m0=True)``): pad to whole 128 x 128 blocks, amax
    per block, ``sf = 2^ceil(log2(amax / 448))``, ``x * (1 / sf)`` to e4m3. Two
    differences, both the issue's spec: an all-zero block's scale is 1 (DeepGEMM
    clamps the amax at 1e-4 first), and ``log2`` is not rounded in float32 (equal on
    these values: no amax here is within 2^-23 of a power of two times 448)."""
    m, n = x.shape
    pm, pn = -(-m // 128) * 128, -(-n // 128) * 128
    padded = torch.zeros((pm, pn), dtype=torch.float32)
    padded[:m, :n] = x.float()
    view = padded.view(pm // 128, 128, pn // 128, 128)
    amax = view.abs().amax(dim=(1, 3), keepdim=True)
    sf = torch.where(amax > 0, torch.pow(2.0, torch.ceil(torch.log2(amax / 448.0))),
                     torch.ones_like(amax))
    q = (view * (1.0 / sf)).to(torch.float8_e4m3fn).view(pm, pn)[:m, :n]
    return q, sf.view(pm // 128, pn // 128).to(torch.float8_e8m0fnu)


@pytest.mark.parametrize("shape", [(256, 384), (300, 517), (128, 128), (1, 700)])
def test_block128_ue8m0_equals_deepgemms_recipe(shape):
    torch = pytest.importorskip("torch")
    from reshard.dtypes import numpy_of_torch, torch_of_numpy

    x = _values(np.random.default_rng(shape[1]), shape).astype(ml_dtypes.bfloat16)
    q, s = reference_cast(x, Cast("float8_e4m3fn", UE8M0))
    assert s.dtype == E8M0 and s.shape == (-(-shape[0] // 128), -(-shape[1] // 128))
    tq, ts = _deepgemm_ue8m0(torch_of_numpy(np.ascontiguousarray(x)), torch)
    np.testing.assert_array_equal(numpy_of_torch(ts).view(np.uint8), s.view(np.uint8))
    np.testing.assert_array_equal(numpy_of_torch(tq.contiguous()).view(np.uint8),
                                  q.view(np.uint8))


@pytest.mark.parametrize("mode, shape, why", [
    (UE8M0, (256,), "128 x 128 blocks of the last two dims"),
    (MX, (), "blocks of 32 along the last dim"),
])
def test_a_format_the_tensor_cannot_take_is_refused(mode, shape, why):
    a, b = DeviceMesh((1,), [0]), DeviceMesh((1,), [1])
    spec = "R" * len(shape) or ""
    with pytest.raises(DTypeError, match=why):
        reshard.plan(shape, "bfloat16", Layout(a, spec), Layout(b, spec),
                     cast="float8_e4m3fn", scale=mode.value)


def test_a_scaled_cast_of_fp8_values_is_refused():
    a, b = DeviceMesh((1,), [0]), DeviceMesh((1,), [1])
    with pytest.raises(DTypeError, match="dequantize it first"):
        reshard.plan((256, 256), "float8_e4m3fn", Layout(a, "RR"), Layout(b, "RR"),
                     cast="float8_e5m2", scale="mx32")


def test_unknown_format_names_the_valid_ones():
    with pytest.raises(DTypeError, match=r"block128-ue8m0.*mx32"):
        ScaleMode.parse("mxfp4")
    assert ScaleMode.parse("block128_ue8m0") is UE8M0 and ScaleMode.parse("MX32") is MX


@pytest.mark.parametrize("mode, scale_bytes", [
    (ScaleMode.BLOCK128, 4 * 8 * 8), (UE8M0, 8 * 8), (MX, 1024 * 32)])
def test_the_wire_and_the_bound_count_each_formats_scale_bytes(mode, scale_bytes):
    """A 1024 x 1024 bf16 weight, replicated at its source, to one device: the plan
    moves its fp8 elements and its scales in their own width (float32: 4 bytes a
    block; E8M0: 1), and the lower bound charges the same bytes."""
    a, b = DeviceMesh((1,), [0]), DeviceMesh((1,), [8])
    cluster = Cluster.regular(2, 8)
    p = reshard.plan((1024, 1024), "bfloat16", Layout(a, "RR"), Layout(b, "RR"),
                     cluster=cluster, cast="float8_e4m3fn", scale=mode.value)
    moved = {t.tensor: 0 for t in p.tasks}
    for t in p.tasks:
        moved[t.tensor] += t.nbytes
    assert moved[0] == 1024 * 1024 and moved[p.tensors[0].link] == scale_bytes
    unscaled = reshard.plan((1024, 1024), "bfloat16", Layout(a, "RR"), Layout(b, "RR"),
                            cluster=cluster, cast="float8_e4m3fn")
    nic = cluster.nic_capacity
    assert p.lower_bound() - unscaled.lower_bound() == pytest.approx(scale_bytes / nic,
                                                                     rel=1e-6)

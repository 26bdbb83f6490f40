"""reshard.casting's torch path divides by tensors, never by a Python number.

On CUDA torch turns ``tensor / python_float`` into a multiplication by the float's
reciprocal, rounded once: one ulp off the quotient for some values (an H200 run cast
224,957 of 132 M elements of a DeepSeek-V3 FFN weight one code off the reference
that way). A division by a tensor is a true division on every device. The CPU cannot
show CUDA's rounding, so these tests watch every division the torch path makes (a
TorchFunctionMode sees each call) and require a tensor divisor, and show that the
reciprocal's product is indeed not the quotient for such values."""

from __future__ import annotations

import numpy as np
import pytest

from reshard import casting
from reshard.dtypes import ScaleMode, block_shape, scale_grid

torch = pytest.importorskip("torch")
from torch.overrides import TorchFunctionMode

_DIVISIONS = {"div", "div_", "divide", "true_divide", "__truediv__", "__itruediv__"}


class Divisions(TorchFunctionMode):
    """Records the divisor of every torch division made inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.divisors: list[object] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in _DIVISIONS:
            self.divisors.append(args[1] if len(args) > 1 else kwargs.get("other"))
        return func(*args, **kwargs)


def _amax() -> object:
    rng = np.random.default_rng(0)
    a = np.abs(rng.standard_normal((9, 7))).astype(np.float32) * 448
    a[0, 0] = 0
    return torch.from_numpy(a)


@pytest.mark.parametrize("mode", [ScaleMode.TENSOR, ScaleMode.BLOCK128,
                                  ScaleMode.BLOCK128_UE8M0, ScaleMode.MX32])
@pytest.mark.parametrize("target", ["float8_e4m3fn", "float8_e5m2"])
def test_scales_divide_by_tensors(mode, target):
    amax = _amax()
    with Divisions() as seen:
        got = casting.scales_from_amax(amax, target, mode)
    want = casting.scales_from_amax(amax.numpy(), target, mode)
    assert got.numpy().tobytes() == want.tobytes()
    assert all(isinstance(d, torch.Tensor) for d in seen.divisors), seen.divisors
    if mode in (ScaleMode.TENSOR, ScaleMode.BLOCK128, ScaleMode.BLOCK128_UE8M0):
        assert seen.divisors  # these modes divide by the largest finite value


def test_quantize_divides_by_tensors():
    rng = np.random.default_rng(1)
    shape = (200, 300)
    x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    mode = ScaleMode.BLOCK128
    block, grid = block_shape(shape, mode), scale_grid(shape, mode)
    box = tuple((0, n) for n in shape)
    amax = casting.block_amax(x, box, block, grid)
    scales = casting.scales_from_amax(amax, "float8_e4m3fn", mode)
    out = torch.empty(shape, dtype=torch.float8_e4m3fn)
    with Divisions() as seen:
        casting.quantize_into(out, x, box, block, scales, tuple((0, g) for g in grid),
                              "float8_e4m3fn")
    assert seen.divisors and all(isinstance(d, torch.Tensor) for d in seen.divisors)
    want, _ = casting.reference_cast(x.numpy(), casting.Cast("float8_e4m3fn", mode))
    assert out.view(torch.uint8).numpy().tobytes() == want.view(np.uint8).tobytes()


def test_the_reciprocals_product_is_not_the_quotient():
    """Why: for amaxes of real weights ``amax * (1/448)`` (what CUDA computes for
    ``amax / 448.0``) differs from ``amax / 448`` in float32, by one ulp."""
    a = np.abs(np.random.default_rng(2).standard_normal(1 << 16)).astype(np.float32)
    quotient = a / np.float32(448)
    product = a * np.float32(1 / np.float32(448))
    assert (quotient != product).sum() > 100

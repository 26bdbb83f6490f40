"""The fused cast kernels on a GPU (reshard.kernels), through reshard.casting as the nccl
backend (cupy arrays) and torch's NCCL ranks (torch CUDA tensors) call it: every scale
format and fp32 -> bf16, bit for bit against reference_cast, on a DeepSeek-V3 FFN tile,
uneven shapes, every bfloat16 pattern, special values and boxes of shards; and torch's
own (eager) path on CUDA exact too (the division by tensors). The CPU tier runs the same
arithmetic on the CPU (tests/unit/test_cast_kernels.py); this checks the device-only
parts (thread coordinates, the amax's warp reduction and atomics, vector loads) and the
compiler. Skipped without cupy or a GPU."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from reshard import casting
from reshard.dtypes import Cast, ScaleMode, block_shape, parse_dtype, scale_grid, storage
from reshard.kernels import cast_launch

pytestmark = pytest.mark.gpu

FP8 = ("float8_e4m3fn", "float8_e5m2")
MODES = (ScaleMode.TENSOR, ScaleMode.BLOCK128, ScaleMode.BLOCK128_UE8M0, ScaleMode.MX32)


def _values(rng: np.random.Generator, shape: tuple[int, ...], special: bool) -> np.ndarray:
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, (*shape[:-1], 1)))
    x = x.astype(np.float32)
    if special:
        flat = x.reshape(-1)
        flat[:200] = 0
        for p, v in zip(rng.choice(flat.size, 9, replace=False),
                        [np.nan, -np.nan, np.inf, -np.inf, -0.0, 1e-42, 6e4, -5e5, 464.0]):
            flat[p] = v
    return x


def _host_bits(x: np.ndarray, source: str) -> np.ndarray:
    return x.astype(ml_dtypes.bfloat16).view(np.uint16) if source == "bfloat16" else x


def _on_device(bits: np.ndarray, source: str, lib: str):
    if lib == "cupy":
        import cupy

        return cupy.asarray(bits)
    import torch

    t = torch.from_numpy(bits.copy())
    return (t.view(torch.bfloat16) if source == "bfloat16" else t).cuda()


def _empty(shape, name: str, lib: str):
    if lib == "cupy":
        import cupy

        return cupy.empty(shape, storage(name))
    import torch

    return torch.empty(shape, dtype=getattr(torch, name), device="cuda")


def _host(a) -> np.ndarray:
    if type(a).__module__.startswith("torch"):
        import torch

        if a.dtype != torch.float32:  # bfloat16, float8: their bits
            a = a.view(torch.int16 if a.element_size() == 2 else torch.uint8)
        return a.cpu().numpy()
    import cupy

    return cupy.asnumpy(a)


def device_cast(x, source: str, cast: Cast, lib: str, stored: bool = True):
    """The cast as derived.py and execution.py run it on a device: amax, scales (stored
    in the scale dtype unless ``stored`` is false), quantize; or one conversion."""
    return casting.cast_whole(x, cast, lambda shape, name: _empty(shape, name, lib), source,
                              stored=stored)


def check(x: np.ndarray, source: str, cast: Cast, lib: str, stored: bool = True) -> None:
    bits = _host_bits(x, source)
    got, got_scales = device_cast(_on_device(bits, source, lib), source, cast, lib, stored)
    true = bits.view(ml_dtypes.bfloat16) if source == "bfloat16" else bits
    with np.errstate(all="ignore"):
        want, want_scales = casting.reference_cast(true, cast)
    if want_scales is not None and not stored:
        want_scales = np.asarray(want_scales).astype(np.float32)
    g = _host(got)
    assert g.tobytes() == want.view(g.dtype).tobytes(), (cast, x.shape, lib,
                                                         int((g != want.view(g.dtype)).sum()))
    if want_scales is not None:
        s = _host(got_scales)
        assert s.tobytes() == np.asarray(want_scales).view(s.dtype).tobytes()


@pytest.fixture(params=["cupy", "torch"])
def lib(request, gpus):
    if request.param == "torch":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("torch sees no CUDA device")
    return request.param


@pytest.mark.timeout(300)
@pytest.mark.parametrize("source", ["bfloat16", "float32"])
def test_every_format_bit_exact(lib, source):
    rng = np.random.default_rng(3)
    for shape in [(1024, 2304), (300, 200), (3, 130, 70), (1000,)]:
        for special in (False, True):
            x = _values(rng, shape, special)
            for target in FP8:
                check(x, source, Cast(target), lib)
                for mode in MODES:
                    if len(shape) >= mode.min_rank:
                        check(x, source, Cast(target, mode), lib)
            if source == "float32":
                check(x, source, Cast("bfloat16"), lib)


@pytest.mark.timeout(120)
def test_every_bf16_pattern(lib):
    v = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    finite = v[np.isfinite(v)]
    x = finite[np.argsort(np.abs(finite), kind="stable")].reshape(510, 128)
    for target in FP8:
        for mode in MODES:
            check(x, "bfloat16", Cast(target, mode), lib)
    check(v.reshape(256, 256), "bfloat16", Cast("float8_e4m3fn"), lib)


@pytest.mark.timeout(120)
def test_the_kernels_take_the_weight_sync_cases(gpus):
    """The FFN weight's cast runs on the fused kernels (not the general path)."""
    import cupy

    x = cupy.zeros((7168, 18432), cupy.uint16)
    box = ((0, 7168), (0, 18432))
    mode = ScaleMode.BLOCK128
    block, grid = block_shape(x.shape, mode), scale_grid(x.shape, mode)
    amax = cast_launch.block_amax(x, box, block, grid, "bfloat16")
    assert amax is not None
    scales = cast_launch.scales_from_amax(amax, "float8_e4m3fn", mode)
    assert scales is not None
    out = cupy.empty(x.shape, cupy.uint8)
    assert cast_launch.quantize_into(out, x, box, block, scales, ((0, 56), (0, 144)),
                                     "float8_e4m3fn", "bfloat16")
    assert int((out != 0).sum()) == 0 and float(scales.max()) == 1.0


@pytest.mark.timeout(180)
@pytest.mark.parametrize("source", ["bfloat16", "float32"])
def test_boxes_of_a_shard(gpus, source):
    """Strided boxes of a shard (what a plan packs): block amax of the box, scales of a
    larger grid box, quantize into a flat buffer, against the numpy kernels."""
    import cupy

    rng = np.random.default_rng(5)
    shape = (3, 520, 700)
    host = _host_bits(_values(rng, shape, True), source)
    dev = cupy.asarray(host)
    for box in [((0, 3), (0, 520), (0, 700)), ((1, 3), (128, 384), (256, 512)),
                ((0, 2), (5, 300), (7, 650)), ((2, 3), (0, 1), (0, 700))]:
        sl = tuple(slice(a, c) for a, c in box)
        for mode in MODES:
            block, grid = block_shape(shape, mode), scale_grid(shape, mode)
            got = casting.block_amax(dev[sl], box, block, grid, source)
            want = casting.block_amax(host[sl], box, block, grid, source)
            assert np.array_equal(cupy.asnumpy(got), want, equal_nan=True)
            with np.errstate(all="ignore"):
                scales = casting.scales_from_amax(want, "float8_e4m3fn", mode)
            out = cupy.zeros(int(np.prod([c - a for a, c in box])), cupy.uint8)
            casting.quantize_into(out, dev[sl], box, block, cupy.asarray(scales),
                                  tuple((0, g) for g in grid), "float8_e4m3fn", source)
            ref = np.zeros(out.shape, parse_dtype("float8_e4m3fn"))
            with np.errstate(all="ignore"):
                casting.quantize_into(ref, host[sl], box, block, scales,
                                      tuple((0, g) for g in grid), "float8_e4m3fn", source)
            assert cupy.asnumpy(out).tobytes() == ref.view(np.uint8).tobytes()


@pytest.mark.timeout(180)
def test_torch_eager_path_is_exact_on_cuda(gpus, monkeypatch):
    """Without the fused kernels (as on a machine without cupy), torch's own operations
    on CUDA equal the reference: the scales are true divisions."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    monkeypatch.setattr(cast_launch.GpuRunner, "accepts", lambda self, *a: False)
    rng = np.random.default_rng(9)
    x = _values(rng, (1024, 2304), False)
    for mode in MODES:
        check(x, "bfloat16", Cast("float8_e4m3fn", mode), "torch", stored=False)

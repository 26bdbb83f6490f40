"""The fused cast kernels' arithmetic, bit for bit, on the CPU: their own source
(reshard.kernels.cast_source.COMMON, ``__host__ __device__``) compiled by the system's
C++ compiler (tests/unit/_cast_twin.py), every thread of each launch's grid run in turn,
the launches planned by reshard.kernels.cast_launch exactly as for the GPU. Held against
reshard.casting's numpy reference: every bfloat16 bit pattern (NaN, infinities,
subnormals, ties, saturation) through the encoders, the scales and the division; whole
tensors of every scale format against reference_cast; boxes of shards (uneven, strided,
sub-blocks, more than three dims) against the numpy kernels."""

from __future__ import annotations

import platform
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshard import casting
from reshard.dtypes import Cast, ScaleMode, block_shape, parse_dtype, scale_grid, storage
from reshard.kernels import cast_launch as cl
from reshard.kernels.cast_geometry import geometry

from ._cast_twin import Twin, compiler

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C++ compiler for the twin")

FP8 = ("float8_e4m3fn", "float8_e5m2")
MODES = (ScaleMode.TENSOR, ScaleMode.BLOCK128, ScaleMode.BLOCK128_UE8M0, ScaleMode.MX32)
X86 = platform.machine().lower() in ("x86_64", "amd64", "i686")


class TwinRunner:
    """cast_launch's runner on host memory: numpy arrays, launches run by the twin."""

    def __init__(self, twin: Twin) -> None:
        self.twin = twin
        self.launches: list[cl.Launch] = []

    def accepts(self, *arrays):
        return all(isinstance(a, np.ndarray) for a in arrays)

    def zeros(self, like, shape):
        return np.zeros(shape, np.float32)

    def empty(self, like, shape, dtype):
        return np.empty(shape, dtype)

    def contiguous(self, a):
        return np.ascontiguousarray(a)

    def run(self, go, like):
        self.launches.append(go)
        self.twin.run(go)


@pytest.fixture(scope="module")
def twin(tmp_path_factory) -> Twin:
    return Twin(tmp_path_factory.mktemp("cast_twin"))


@pytest.fixture
def runner(twin) -> TwinRunner:
    return TwinRunner(twin)


def all_bf16() -> np.ndarray:
    """Every bfloat16 bit pattern, as float32 bits."""
    return np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)


def tricky_f32(rng: np.random.Generator, n: int = 1 << 20) -> np.ndarray:
    """float32 bits: random patterns, and each float8 kind's rounding midpoints (every
    pair of neighbouring codes' mean, one ulp either side), both signs."""
    parts = [rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)]
    for name in FP8:
        codes = np.arange(256, dtype=np.uint8).view(parse_dtype(name)).astype(np.float64)
        codes = np.unique(codes[np.isfinite(codes)])
        mids = ((codes[1:] + codes[:-1]) / 2).astype(np.float32)
        for m in (mids, codes.astype(np.float32)):
            b = m.view(np.uint32)
            parts += [b, b + np.uint32(1), b - np.uint32(1)]
    whole = np.concatenate(parts)
    return np.concatenate([whole, whole | np.uint32(0x80000000)])


# ----- the element functions ----------------------------------------------------------
@pytest.mark.parametrize("target", FP8)
def test_encode_equals_ml_dtypes(twin, target):
    bits = np.concatenate([all_bf16(), tricky_f32(np.random.default_rng(1))])
    got = twin.encode_f8(target, bits)
    with np.errstate(all="ignore"):
        want = bits.view(np.float32).astype(parse_dtype(target)).view(np.uint8)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("target", [*FP8, "bfloat16"])
def test_clip_and_encode_equal_the_reference(twin, target):
    """The quantize's last step, as convert_into's numpy path does it."""
    bits = np.concatenate([all_bf16(), tricky_f32(np.random.default_rng(2))])
    got = twin.put(target, bits)
    want = np.empty(bits.shape, parse_dtype(target))
    with np.errstate(all="ignore"):
        casting.convert_into(want, bits.view(np.float32), target)
    assert got.tobytes() == want.tobytes()


def test_division_equals_the_hosts_nan_included(twin):
    a = all_bf16()
    specials = np.array([1.0, -1.0, 448.0, 3.0, 2.0 ** -127, 2.0 ** -149, 1e-40, 3e38,
                         np.inf, -np.inf, np.nan, 0.0], np.float32).view(np.uint32)
    specials = np.concatenate([specials, np.array([0x7F800001, 0xFFC12345], np.uint32)])
    for b in specials:
        bb = np.full(a.shape, b, np.uint32)
        got = twin.div(a, bb)
        with np.errstate(all="ignore"):
            want = (a.view(np.float32) / bb.view(np.float32)).view(np.uint32)
        nan = np.isnan(want.view(np.float32))
        assert np.array_equal(np.isnan(got.view(np.float32)), nan)
        assert np.array_equal(got[~nan], want[~nan])
        if X86:  # which NaN: the first NaN operand's, else the default (negative) one
            assert np.array_equal(got[nan], want[nan])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("target", FP8)
def test_scales_and_codes_equal_the_reference(runner, mode, target):
    rng = np.random.default_rng(3)
    mags = np.concatenate([all_bf16(), tricky_f32(rng, 1 << 18)]) & np.uint32(0x7FFFFFFF)
    edge = np.float32(ml_dtypes.finfo(parse_dtype(target)).max)
    with np.errstate(all="ignore"):
        powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32) * edge
    extra = np.concatenate([powers, np.nextafter(powers, np.float32(np.inf))]).view(np.uint32)
    amax = np.concatenate([mags, extra & np.uint32(0x7FFFFFFF)]).view(np.float32)
    codes = np.empty(amax.shape, np.uint8)
    got = cl.scales_from_amax(amax, target, mode, codes if mode.scale_dtype != "float32"
                              else None, runner)
    with np.errstate(all="ignore"):
        want = casting.scales_from_amax(amax, target, mode)
    assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
    if mode.scale_dtype != "float32":
        assert codes.tobytes() == casting.stored_scales(want, mode).view(np.uint8).tobytes()
        again = np.empty(amax.shape, np.uint8)
        assert cl.store_e8m0(again, want, runner) and again.tobytes() == codes.tobytes()


def test_e8m0_codes_of_any_float32(runner):
    bits = np.concatenate([all_bf16(), tricky_f32(np.random.default_rng(4), 1 << 18)])
    values = bits.view(np.float32)
    got = np.empty(values.shape, np.uint8)
    assert cl.store_e8m0(got, values, runner)
    with np.errstate(all="ignore"):
        want = values.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("target", FP8)
@pytest.mark.parametrize("source", ["bfloat16", "float32"])
def test_every_element_divided_by_every_kind_of_scale(runner, target, source):
    """Every bf16 pattern (and tricky float32s) over one scale of each kind, through the
    quantize kernel against quantize_into's numpy path."""
    x = all_bf16() if source == "bfloat16" else tricky_f32(np.random.default_rng(5), 1 << 16)
    held = (x >> np.uint32(16)).astype(np.uint16) if source == "bfloat16" else x.view(np.float32)
    n = held.size
    for s in (1.0, 0.5, 3.0, 1 / 448, 2.0 ** -127, 1e-40, 7.1e-3, 2.0 ** 100, 3e38, np.inf,
              np.nan):
        scales = np.array([s], np.float32)
        got = np.empty(n, np.uint8)
        assert cl.quantize_into(got, held, ((0, n),), (n,), scales, ((0, 1),), target, source,
                                runner)
        want = np.empty(n, parse_dtype(target))
        with np.errstate(all="ignore"):
            casting.quantize_into(want, held, ((0, n),), (n,), scales, ((0, 1),), target,
                                  source)
        if X86:
            assert got.tobytes() == want.view(np.uint8).tobytes(), s
        else:
            assert np.array_equal(got & 0x7F, want.view(np.uint8) & 0x7F), s


# ----- whole tensors against reference_cast ---------------------------------------------
def fused_cast(x: np.ndarray, source: str, cast: Cast, runner: TwinRunner):
    """The cast as the GPU runs it: amax, scales (+ codes), quantize: three launches of
    the kernels (one for a cast without scales)."""
    shape = x.shape
    box = tuple((0, n) for n in shape)
    out = np.empty(shape, storage(cast.dtype))
    if cast.scale is ScaleMode.NONE:
        assert cl.convert_into(out, x, cast.dtype, source, runner)
        return out, None
    block, grid = block_shape(shape, cast.scale), scale_grid(shape, cast.scale)
    amax = cl.block_amax(x, box, block, grid, source, runner)
    codes = None if cast.scale.scale_dtype == "float32" else np.empty(grid, np.uint8)
    scales = cl.scales_from_amax(amax, cast.dtype, cast.scale, codes, runner)
    assert cl.quantize_into(out, x, box, block, scales, tuple((0, g) for g in grid), cast.dtype,
                            source, runner)
    return out, scales if codes is None else codes


def _held(values: np.ndarray, source: str) -> np.ndarray:
    """float32 values as the GPU holds ``source``: bf16 as its bits (values rounded)."""
    if source == "float32":
        return values.astype(np.float32)
    return values.astype(ml_dtypes.bfloat16).view(np.uint16)


def _true(held: np.ndarray, source: str) -> np.ndarray:
    return held.view(ml_dtypes.bfloat16) if source == "bfloat16" else held


def check_cast(x: np.ndarray, source: str, cast: Cast, runner: TwinRunner) -> None:
    held = _held(x, source)
    got, got_scales = fused_cast(held, source, cast, runner)
    with np.errstate(all="ignore"):
        want, want_scales = casting.reference_cast(_true(held, source), cast)
    assert got.tobytes() == want.view(got.dtype).tobytes(), (cast, x.shape)
    if want_scales is not None:
        assert got_scales.tobytes() == np.asarray(want_scales).view(got_scales.dtype).tobytes()


def finite_bf16_sorted() -> np.ndarray:
    """Every finite bf16 value, ordered by magnitude (so that a block holds values of
    like size and its scale matters), as float32 [510, 128]."""
    v = all_bf16().view(np.float32)
    v = v[np.isfinite(v)]
    return v[np.argsort(np.abs(v), kind="stable")].reshape(510, 128)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("target", FP8)
def test_every_bf16_value_in_every_format(runner, mode, target):
    x = finite_bf16_sorted()
    check_cast(x, "bfloat16", Cast(target, mode), runner)
    check_cast(np.ascontiguousarray(x.T), "bfloat16", Cast(target, mode), runner)


def special_tensor(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values of many magnitudes with all-zero blocks, NaN, infinities, -0, subnormals
    and values past the float8 range, in some blocks."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-140, 120, (*shape[:-1], 1)))
    x = x.astype(np.float32)
    flat = x.reshape(-1)
    k = flat.size
    flat[: min(k, 300)] = 0
    picks = rng.choice(k, size=min(k, 12), replace=False)
    for p, v in zip(picks, [np.nan, -np.nan, np.inf, -np.inf, -0.0, 1e-42, -3e-39, 6e4, -5e5,
                            448.0, 464.0, 57344.0]):
        flat[p] = v
    return x


@pytest.mark.parametrize("shape", [(300, 200), (3, 130, 70), (1000,), (129, 1), (2, 2, 3, 257)])
@pytest.mark.parametrize("source", ["bfloat16", "float32"])
def test_uneven_tensors_with_special_values(runner, shape, source):
    rng = np.random.default_rng(sum(shape))
    x = special_tensor(rng, shape)
    calm = rng.standard_normal(shape).astype(np.float32) * 3  # no NaN: scales matter
    for target in FP8:
        for mode in MODES:
            if len(shape) < mode.min_rank:
                continue
            check_cast(x, source, Cast(target, mode), runner)
            check_cast(calm, source, Cast(target, mode), runner)
        check_cast(x, source, Cast(target), runner)
    if source == "float32":
        check_cast(x, source, Cast("bfloat16"), runner)


def test_every_format_runs_two_passes_over_the_data(runner):
    x = np.ones((256, 256), np.float32)
    fused_cast(x, "float32", Cast("float8_e4m3fn", ScaleMode.BLOCK128), runner)
    kinds = [go.kernel.split("_")[1] for go in runner.launches]
    assert kinds == ["amax", "scales", "quantize"]
    assert runner.launches[0].kernel.endswith("_v4")  # 16-byte loads on aligned rows


# ----- boxes of shards -----------------------------------------------------------------
@st.composite
def shard_cases(draw):
    """A tensor shape (rank 1-4), a shard box inside it, a box inside the shard, a
    source of the shard as a strided view, a scale format."""
    mode = draw(st.sampled_from(MODES))
    ndim = draw(st.integers(max(1, mode.min_rank), 4))
    shape = tuple(draw(st.integers(1, 300 if i >= ndim - 2 else 4)) for i in range(ndim))
    shard, box = [], []
    for n in shape:
        a = draw(st.integers(0, n - 1))
        c = draw(st.integers(a + 1, n))
        b0 = draw(st.integers(a, c - 1))
        shard.append((a, c))
        box.append((b0, draw(st.integers(b0 + 1, c))))
    pad = draw(st.integers(0, 3))
    return (mode, shape, tuple(shard), tuple(box), pad, draw(st.sampled_from(FP8)),
            draw(st.sampled_from(["bfloat16", "float32"])), draw(st.integers(0, 2 ** 31)))


def _shard(rng, shard, source, pad):
    """The shard's values held as ``source``, inside a larger array (a strided view)."""
    ext = [c - a for a, c in shard]
    big = special_tensor(rng, tuple(e + pad for e in ext))
    return _held(big, source)[tuple(slice(0, e) for e in ext)]


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(case=shard_cases())
def test_boxes_of_shards_equal_the_numpy_kernels(twin, case):
    mode, shape, shard, box, pad, target, source, seed = case
    runner = TwinRunner(twin)
    rng = np.random.default_rng(seed)
    values = _shard(rng, shard, source, pad)
    local = tuple(slice(a - s, c - s) for (a, c), (s, _) in zip(box, shard))
    view = values[local]
    block, grid = block_shape(shape, mode), scale_grid(shape, mode)
    got = cl.block_amax(view, box, block, grid, source, runner)
    want = casting.block_amax(view, box, block, grid, source)
    if got is None:  # the kernels decline: more than three dims that do not merge
        assert geometry(box, [1] * len(box), [1] * len(box), block, [0] * len(box),
                        [1] * len(box), 2, 2) is None or len(box) > 3
        return
    assert np.array_equal(got, want, equal_nan=True)
    sbox = casting.block_range(box, block)
    part = want[tuple(slice(a, c) for a, c in sbox)]  # a box of the grid: strided
    with np.errstate(all="ignore"):
        scales = casting.scales_from_amax(want, target, mode)
        fused = cl.scales_from_amax(part, target, mode, None, runner)
    assert fused.tobytes() == np.ascontiguousarray(
        scales[tuple(slice(a, c) for a, c in sbox)]).tobytes()
    scales = np.ascontiguousarray(scales[tuple(slice(a, c) for a, c in sbox)])
    for out_kind in ("flat", "strided"):
        ext = tuple(c - a for a, c in box)
        if out_kind == "flat":
            out = np.zeros(int(np.prod(ext)), np.uint8)
        else:
            out = np.zeros(tuple(e + 1 for e in ext), np.uint8)[tuple(slice(0, e) for e in ext)]
        ref = np.zeros(out.shape, parse_dtype(target))
        if not cl.quantize_into(out, view, box, block, scales, sbox, target, source, runner):
            return
        with np.errstate(all="ignore"):
            casting.quantize_into(ref, view, box, block, scales, sbox, target, source)
        if X86:
            assert out.tobytes() == ref.view(np.uint8).tobytes()
        else:
            assert np.array_equal(out & 0x7F, ref.view(np.uint8) & 0x7F)


def test_geometry_folds_merges_and_declines():
    # a [E, R, C] box cut in every dim: three dims kept, 16-byte vectors inside blocks
    g = geometry(((1, 3), (128, 384), (256, 512)), (1024 * 1024, 1024, 1),
                 (256 * 256, 256, 1), (1, 128, 128), (0, 0, 0), (64, 8, 1), 2, 1)
    assert g is not None and [d.n for d in g.dims] == [2, 256, 256] and g.vec == 8
    assert g.base == 1 * 64 and g.dims[0].sh == 0 and g.dims[0].g == 0  # folded
    # a box starting mid-vector: vectors of 1
    g = geometry(((0, 4), (3, 131)), (1024, 1), (128, 1), (128, 128), (0, 0), (8, 1), 2, 1)
    assert g is not None and g.vec == 1
    # length-1 dims fold away; five dims of one contiguous tensor merge to three
    g = geometry(((0, 2), (0, 3), (0, 4), (5, 6), (0, 256)), (3072, 1024, 256, 256, 1),
                 (3072, 1024, 256, 256, 1), (1, 1, 1, 1, 32), (0, 0, 0, 0, 0),
                 (96, 32, 8, 8, 1), 4, 1)
    assert g is not None and [d.n for d in g.dims] == [6, 4, 256]
    # four dims that cannot merge (each strided on its own): declined
    assert geometry(((0, 2), (0, 3), (0, 4), (0, 5)), (1000, 100, 10, 1), (60, 20, 5, 1),
                    (1, 1, 1, 1), (0, 0, 0, 0), (0, 0, 0, 0), 4, 1) is None
    # a dim without blocks never merges with one that has them
    assert geometry(((0, 2), (0, 3), (0, 4), (0, 5)), (60, 20, 5, 1), (60, 20, 5, 1),
                    (1, 1, 1, 1), (0, 0, 0, 0), (0, 7, 3, 1), 4, 1) is None
    # a long row without blocks becomes rows (the amax's row tiles)
    g = geometry(((0, 1 << 20),), (1,), (1,), (1 << 20,), (0,), (1,), 2, 1)
    assert g is not None and [d.n for d in g.dims] == [1, 256, 4096]


# ----- the GPU's own compiler ----------------------------------------------------------
def test_the_source_compiles_for_hopper_without_spills(tmp_path):
    """nvcc (the CUDA toolkit's, no GPU or driver needed) compiles the kernels for sm_90:
    every entry point a launch can name exists, none spills registers to memory."""
    import shutil
    import subprocess

    from reshard.kernels.cast_source import SOURCE

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc")
    cu = tmp_path / "casts.cu"
    cu.write_text(SOURCE)
    done = subprocess.run([nvcc, "--std=c++17", "-arch=sm_90", "--cubin", "-Xptxas", "-v",
                           "-o", str(tmp_path / "casts.cubin"), str(cu)], capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = set(re.findall(r"Compiling entry function '(\w+)'", done.stderr))
    spills = re.findall(r"(\d+) bytes spill stores", done.stderr)
    assert spills and set(spills) == {"0"}, spills
    planned = {"reshard_scales", "reshard_e8m0"}
    for kind, item in (("bf16", 2), ("f32", 4)):
        for v in (1, 16 // item):
            planned.add(f"reshard_amax_{kind}_v{v}")
            for t in ("e4m3", "e5m2"):
                planned |= {f"reshard_quantize_{kind}_{t}_{s}_v{v}" for s in "sn"}
    planned |= {"reshard_quantize_f32_bf16_n_v1", "reshard_quantize_f32_bf16_n_v4"}
    assert planned <= compiled, planned - compiled

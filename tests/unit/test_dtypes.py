"""The dtype policy (reshard.dtypes), the cast kernels and their reference
(reshard.casting), and casts on the wire through the reference backend: bfloat16 and
float8 move bit-exact, narrow partial sums are summed in float32 and rounded once, and
a cast (fp32 -> bf16, bf16 -> fp8 with per-tensor or 128 x 128 block scales) delivers
the reference bit for bit, with the narrow type's bytes on the wire."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout, ReshardPlan
from reshard.casting import block_amax, quantize_into, reference_cast, scales_from_amax
from reshard.dtypes import (
    DTYPES,
    Cast,
    ScaleMode,
    accumulate,
    accumulator,
    dtype_name,
    parse_dtype,
    scale_grid,
)
from reshard.planner.values.tasks import Derive
from reshard.runtime import Runtime

from ..common import cast_values, check_shards, meshes, narrow_addends, specs, wire_bytes

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
CL = Cluster.regular(4, 2)


# ----- the policy ---------------------------------------------------------------------------
@pytest.mark.parametrize("spelling, name", [
    ("bfloat16", "bfloat16"), ("bf16", "bfloat16"), (ml_dtypes.bfloat16, "bfloat16"),
    (BF16, "bfloat16"), ("float8_e4m3fn", "float8_e4m3fn"), (ml_dtypes.float8_e5m2, "float8_e5m2"),
    ("torch.bfloat16", "bfloat16"), (np.float32, "float32"), ("f4", "float32"),
    ("uint16", "uint16"), (bool, "bool"), ("fp8_e4m3", "float8_e4m3fn"),
])
def test_parse_dtype(spelling, name):
    assert parse_dtype(spelling).name == name


def test_parse_dtype_torch_and_jax():
    torch = pytest.importorskip("torch")
    for t in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float16):
        assert parse_dtype(t).name == str(t).removeprefix("torch.")
    jnp = pytest.importorskip("jax.numpy")
    assert parse_dtype(jnp.bfloat16).name == "bfloat16"
    assert parse_dtype(jnp.zeros(2, jnp.float8_e4m3fn).dtype).name == "float8_e4m3fn"


@pytest.mark.parametrize("bad", [">f4", "U3", object, "float99", np.longdouble, "V2"])
def test_parse_dtype_refuses(bad):
    with pytest.raises(reshard.DTypeError, match=r"valid dtypes.*bfloat16"):
        parse_dtype(bad)


def test_every_dtype_round_trips_by_name():
    for name in DTYPES:
        dt = parse_dtype(name)
        assert dt.name == name and parse_dtype(dt) == dt
        assert dtype_name(dt) == dtype_name(name) == name  # the lookup and the parse agree
    with pytest.raises(reshard.DTypeError, match="not supported"):
        dtype_name(np.dtype(">f4"))  # equal in kind, not in byte order: not looked up


def test_accumulators():
    assert accumulator("bfloat16") == accumulator("float16") == "float32"
    assert accumulator("int16") == "int16" and accumulator("float64") == "float64"
    assert accumulator("float8_e4m3fn") is None and accumulator("bool") is None


def test_fp8_partial_source_refused():
    mesh = DeviceMesh((2,), [0, 1])
    with pytest.raises(reshard.PartialError, match=r"float8_e4m3fn has no sum.*cast="):
        reshard.plan((4, 4), "float8_e4m3fn", Layout(mesh, "RR+P0"), Layout(mesh, "RR"))


def test_scaled_cast_of_partial_source_refused():
    mesh = DeviceMesh((2,), [0, 1])
    with pytest.raises(reshard.DTypeError, match="partial sum needs the sum's amax"):
        reshard.plan((4, 4), "bfloat16", Layout(mesh, "RR+P0"), Layout(mesh, "RR"),
                     cast="float8_e4m3fn", scale="tensor")
    # an unscaled cast of a partial sum is fine: summed in float32, rounded once
    reshard.plan((4, 4), "bfloat16", Layout(mesh, "RR+P0"), Layout(mesh, "RR"),
                 cast="float8_e4m3fn")


# ----- the reference ------------------------------------------------------------------------
def _naive_block_cast(x: np.ndarray, block: tuple[int, int], target: np.dtype):
    """Per block by loops: amax / max, divide, saturate, round (the definition)."""
    top = float(ml_dtypes.finfo(target).max)
    rows, cols = x.shape
    grid = (-(-rows // block[0]), -(-cols // block[1]))
    scales = np.ones(grid, np.float32)
    out = np.empty(x.shape, target)
    for i in range(grid[0]):
        for j in range(grid[1]):
            sl = (slice(i * block[0], (i + 1) * block[0]), slice(j * block[1], (j + 1) * block[1]))
            part = x[sl].astype(np.float32)
            amax = np.float32(np.abs(part).max())
            if amax > 0:
                scales[i, j] = amax / np.float32(top)
            out[sl] = np.clip(part / scales[i, j], -top, top).astype(target)
    return out, scales


@pytest.mark.parametrize("target", [E4M3, E5M2])
@pytest.mark.parametrize("shape", [(300, 257), (128, 128), (5, 1000), (1, 1)])
def test_reference_block_cast_is_the_definition(target, shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 1000, (shape[0], 1))).astype(BF16)
    x[:2, :3] = 0  # a block may hold zeros; an all-zero block keeps scale 1
    q, s = reference_cast(x, Cast(target.name, ScaleMode.BLOCK128))
    want_q, want_s = _naive_block_cast(x, (128, 128), target)
    assert q.dtype == target and s.dtype == np.float32 and s.shape == scale_grid(shape, ScaleMode.BLOCK128)
    assert np.array_equal(s, want_s) and q.tobytes() == want_q.tobytes()
    top = float(ml_dtypes.finfo(target).max)
    assert np.nanmax(np.abs(q.astype(np.float32))) <= top  # saturated, never inf or NaN


def test_reference_tensor_scale_and_zero_tensor():
    x = np.array([[1.0, -896.0], [3.0, 0.5]], np.float32)
    q, s = reference_cast(x, Cast("float8_e4m3fn", ScaleMode.TENSOR))
    assert s.shape == (1, 1) and s[0, 0] == np.float32(896.0) / np.float32(448)
    assert q.astype(np.float32)[0, 1] == -448.0
    z, zs = reference_cast(np.zeros((3, 4), np.float32), Cast("float8_e4m3fn", ScaleMode.TENSOR))
    assert zs[0, 0] == 1.0 and not z.astype(np.float32).any()


def test_unscaled_cast_saturates_and_rounds_to_nearest_even():
    x = np.array([1000.0, -1e30, np.inf, 447.0, np.nan, 0.0], np.float32)
    q, s = reference_cast(x, Cast("float8_e4m3fn"))
    assert s is None
    got = q.astype(np.float32)
    assert list(got[:4]) == [448.0, -448.0, 448.0, 448.0] and np.isnan(got[4]) and got[5] == 0
    y = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    assert reference_cast(y, Cast("bfloat16"))[0].tobytes() == y.astype(BF16).tobytes()


def test_kernels_on_torch_equal_numpy():
    """The torch path of the kernels (the torch backend's buffers) is bit-exact with the
    numpy reference, and leaves its input alone."""
    torch = pytest.importorskip("torch")
    from reshard.casting import stored_scales
    from reshard.dtypes import block_shape, numpy_of_torch, torch_of_numpy

    rng = np.random.default_rng(7)
    x = (rng.standard_normal((260, 300)) * np.exp(rng.uniform(-30, 30, (260, 1)))).astype(BF16)
    x[:2] = 0  # all-zero blocks of every mode
    for mode in (ScaleMode.TENSOR, ScaleMode.BLOCK128, ScaleMode.BLOCK128_UE8M0,
                 ScaleMode.MX32):
        q, s = reference_cast(x, Cast("float8_e4m3fn", mode))
        tx = torch_of_numpy(x.copy())
        box = ((0, 260), (0, 300))
        block = block_shape(x.shape, mode)
        ts = scales_from_amax(block_amax(tx, box, block, s.shape), "float8_e4m3fn", mode)
        out = torch.empty((260, 300), dtype=torch.float8_e4m3fn)
        quantize_into(out, tx, box, block, ts, tuple((0, g) for g in s.shape), "float8_e4m3fn")
        stored = numpy_of_torch(stored_scales(ts, mode))
        assert stored.dtype == s.dtype and stored.tobytes() == s.tobytes(), mode
        assert out.view(torch.uint8).numpy().tobytes() == q.view(np.uint8).tobytes()
        assert tx.view(torch.uint16).numpy().tobytes() == x.view(np.uint16).tobytes()


def test_block_amax_of_parts_is_the_whole():
    """A block straddling boxes: the max of the boxes' partial amaxes is the block's."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 270)).astype(np.float32)
    grid = scale_grid(x.shape, ScaleMode.BLOCK128)
    whole = block_amax(x, ((0, 300), (0, 270)), (128, 128), grid)
    cuts = [((0, 77), (0, 270)), ((77, 300), (0, 129)), ((77, 300), (129, 270))]
    parts = [block_amax(x[a:b, c:d], ((a, b), (c, d)), (128, 128), grid)
             for (a, b), (c, d) in cuts]
    assert np.array_equal(np.maximum.reduce(parts), whole)


# ----- through the reference backend -------------------------------------------------------
NARROW = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


def _bits(rng, shape, dtype):
    dt = parse_dtype(dtype)
    width = {1: np.uint8, 2: np.uint16}[dt.itemsize]
    return rng.integers(0, 1 << (8 * dt.itemsize), size=shape).astype(width).view(dt)


@st.composite
def layout_pairs(draw, max_rank: int = 3, partial_src: bool = False):
    """(shape, src, dst): uneven shapes, disjoint or overlapping meshes on 8 devices."""
    rank = draw(st.integers(1, max_rank))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank)))
    pool = tuple(draw(st.permutations(range(8))))
    src_mesh = draw(meshes(pool, 3, 8))
    dst_pool = tuple(draw(st.permutations(range(8)))) if draw(st.booleans()) else \
        tuple(d for d in pool if d not in src_mesh.devices) or pool
    dst_mesh = draw(meshes(dst_pool, 3, 8))
    src = Layout(src_mesh, draw(specs(src_mesh.ndim, rank, partial_src)))
    dst = Layout(dst_mesh, draw(specs(dst_mesh.ndim, rank, False)))
    return shape, src, dst


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout_pairs(), st.sampled_from(NARROW), st.sampled_from(("broadcast", "send_recv",
                                                                   "allgather")),
       st.integers(0, 2 ** 32 - 1))
def test_narrow_dtypes_move_bit_exact(problem, dtype, strategy, seed):
    """Any bit pattern (NaNs, infinities, subnormals) arrives unchanged."""
    shape, src, dst = problem
    x = _bits(np.random.default_rng(seed), shape, dtype)
    with Runtime("local", cluster=CL) as rt:
        y = rt.reshard(rt.put(x, src), dst, strategy)
        assert y.dtype == dtype
        check_shards(rt, y, x)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout_pairs(partial_src=True), st.sampled_from(("bfloat16", "float16")),
       st.sampled_from(("broadcast", "send_recv", "allgather")), st.integers(0, 2 ** 32 - 1))
def test_narrow_partial_sums_are_float32_then_rounded_once(problem, dtype, strategy, seed):
    """The result equals the reference (the addends summed in float32, one rounding),
    which differs from summing in the narrow type where the partial groups are big enough
    for a per-hop rounding to show."""
    shape, src, dst = problem
    shards = narrow_addends(np.random.default_rng(seed), shape, src, dtype)
    boxes = src.index_map(shape)
    want = np.zeros(shape, parse_dtype(dtype))  # (replicated groups hold equal addends)
    for group in src.partial_groups():
        want[boxes[group[0]]] = accumulate([shards[d] for d in group], dtype)
    with Runtime("local", cluster=CL) as rt:
        x = rt.put_shards(shards, src, shape, dtype)
        assert rt.get(x).tobytes() == want.tobytes()
        check_shards(rt, rt.reshard(x, dst, strategy), want)


def test_partial_bf16_differs_from_per_hop_rounding():
    """A case where rounding per addend would give another answer: the reshard matches
    the float32 reference, not a bf16 running sum."""
    mesh = DeviceMesh((4,), [0, 1, 2, 3])
    src = Layout(mesh, "R+P0")
    vals = [np.array([1.0], BF16), np.array([2 ** -8], BF16), np.array([2 ** -8], BF16),
            np.array([0.0], BF16)]
    stepwise = vals[0]
    for v in vals[1:]:
        stepwise = (stepwise + v).astype(BF16)  # 1 + 2**-8 rounds back to 1 each time
    want = accumulate(vals, "bfloat16")  # 1 + 2**-7 in float32: a bf16 value
    assert stepwise[0] != want[0]
    with Runtime("local", cluster=CL) as rt:
        x = rt.put_shards(dict(zip(mesh.devices, vals)), src, (1,), "bfloat16")
        for dst in (Layout(DeviceMesh((1,), [5]), "R"), Layout(mesh, "R")):
            assert rt.get(rt.reshard(x, dst)).tobytes() == want.tobytes()


CASTS = [("float32", Cast("bfloat16")), ("float32", Cast("float16")),
         ("bfloat16", Cast("float8_e4m3fn")), ("bfloat16", Cast("float8_e5m2")),
         ("bfloat16", Cast("float8_e4m3fn", ScaleMode.TENSOR)),
         ("float32", Cast("float8_e4m3fn", ScaleMode.TENSOR)),
         ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128)),
         ("bfloat16", Cast("float8_e5m2", ScaleMode.BLOCK128)),
         ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128_UE8M0)),
         ("float32", Cast("float8_e5m2", ScaleMode.BLOCK128_UE8M0)),
         ("bfloat16", Cast("float8_e4m3fn", ScaleMode.MX32)),
         ("float32", Cast("float8_e5m2", ScaleMode.MX32))]


@st.composite
def cast_problems(draw):
    """A cast and a layout pair; block scales get dims that straddle 128."""
    src_dtype, cast = draw(st.sampled_from(CASTS))
    shape, src, dst = draw(layout_pairs())
    if cast.scale in (ScaleMode.BLOCK128, ScaleMode.BLOCK128_UE8M0):
        lead = tuple(draw(st.lists(st.integers(1, 3), max_size=1)))
        shape = (*lead, draw(st.integers(1, 300)), draw(st.integers(1, 300)))
        src = Layout(src.mesh, draw(specs(src.mesh.ndim, len(shape), False)))
        dst = Layout(dst.mesh, draw(specs(dst.mesh.ndim, len(shape), False)))
    elif cast.scale is ScaleMode.MX32:  # last dims that straddle 32
        lead = tuple(draw(st.lists(st.integers(1, 5), max_size=2)))
        shape = (*lead, draw(st.integers(1, 100)))
        src = Layout(src.mesh, draw(specs(src.mesh.ndim, len(shape), False)))
        dst = Layout(dst.mesh, draw(specs(dst.mesh.ndim, len(shape), False)))
    return src_dtype, cast, shape, src, dst


def _check_scales(rt, y, want_scales, cast, plan_dst):
    if cast.scale is ScaleMode.NONE:
        assert y.scales is None
        return
    assert y.scales.dtype == cast.scale.scale_dtype and y.scales.layout.mesh == plan_dst.mesh
    check_shards(rt, y.scales, want_scales)


@settings(max_examples=90, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cast_problems(), st.sampled_from(("broadcast", "send_recv", "allgather")),
       st.integers(0, 2 ** 32 - 1))
def test_cast_on_the_wire_equals_reference(problem, strategy, seed):
    """Sharded, replicated, uneven, overlapping: every destination shard (and every
    delivered scale) is the reference's, bit for bit."""
    src_dtype, cast, shape, src, dst = problem
    x = cast_values(np.random.default_rng(seed), shape, src_dtype)
    want, want_scales = reference_cast(x, cast)
    with Runtime("local", cluster=CL) as rt:
        y = rt.reshard(rt.put(x, src), dst, strategy, cast=cast.dtype, scale=cast.scale)
        assert y.dtype == cast.dtype
        check_shards(rt, y, want)
        _check_scales(rt, y, want_scales, cast, dst)


@pytest.mark.parametrize("src_spec, dst_spec, aligned", [
    ("S0R", "RS0", True),     # 256-row shards: whole blocks, no amax phase
    ("RR", "S0R", True),      # replicated: every device knows every block
    ("S0S1", "RR", False),    # 300 / 2: shards straddle blocks, amax reduced first
])
def test_block_scales_paths(src_spec, dst_spec, aligned):
    """Block-aligned sources compute their own scales; others reduce the amax first (a
    max, in a phase before everything else)."""
    shape = (512, 256) if aligned else (300, 300)
    src = Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), src_spec)
    dst = Layout(DeviceMesh((2, 2), [4, 5, 6, 7]), dst_spec)
    p = reshard.plan(shape, "bfloat16", src, dst, cluster=CL, cast="float8_e4m3fn",
                     scale="block128")
    derives = [t.derive for t in p.tensors]
    if aligned:
        assert derives == [Derive.NONE, Derive.OWN_SCALES]
    else:
        assert derives == [Derive.NONE, Derive.AMAX, Derive.SCALES]
        amax_steps = {t.step for t in p.tasks if t.tensor == 1}
        assert amax_steps and max(amax_steps) < min(t.step for t in p.tasks if t.tensor != 1)
    assert p.inputs == (0,) and p.outputs == (0, len(p.tensors) - 1)
    x = cast_values(np.random.default_rng(1), shape, "bfloat16")
    want, want_scales = reference_cast(x, Cast("float8_e4m3fn", ScaleMode.BLOCK128))
    with Runtime("local", cluster=CL) as rt:
        (y,) = rt.execute(p, [rt.put(x, src)])
        check_shards(rt, y, want)
        check_shards(rt, y.scales, want_scales)
        assert np.array_equal(rt.get(y.scales), want_scales)


def test_wire_carries_the_narrow_type():
    """The bytes the reference fabric carries: a bf16 -> fp8 cast moves half of what the
    bf16 reshard moves (the plan's tasks and the fabric's counters agree), and the block
    scales add 4 bytes per 128 x 128 block delivered."""
    src = Layout(DeviceMesh((4,), [0, 1, 2, 3]), "S0R")
    dst = Layout(DeviceMesh((2, 2), [4, 5, 6, 7]), "RS1")
    x = cast_values(np.random.default_rng(2), (1024, 512), "bfloat16")
    moved = {}
    for key, kw in {"bf16": {}, "fp8": {"cast": "float8_e4m3fn"},
                    "fp8-block": {"cast": "float8_e4m3fn", "scale": "block128"}}.items():
        with Runtime("local", cluster=CL) as rt:
            a = rt.put(x, src)
            p = rt.plan(a, dst, **kw)
            fabric_before = rt.group.fabric.total_bytes()
            rt.execute(p, [a])
            moved[key] = rt.group.fabric.total_bytes() - fabric_before
            assert moved[key] == wire_bytes(p), key
    assert moved["fp8"] * 2 == moved["bf16"]
    blocks = math.prod(scale_grid((1024, 512), ScaleMode.BLOCK128))
    # each destination device receives the scales of its blocks (4 bytes each)
    assert moved["fp8"] < moved["fp8-block"] <= moved["fp8"] + 4 * blocks * 4


def test_scaled_plan_json_round_trip_and_tampering():
    src = Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "S0S1")
    dst = Layout(DeviceMesh((4,), [4, 5, 6, 7]), "RS0")
    p = reshard.plan((300, 300), "bfloat16", src, dst, cluster=CL, cast="float8_e4m3fn",
                     scale="block128")
    again = ReshardPlan.from_json(p.to_json())
    assert again == p and again.tensors[0].scale is ScaleMode.BLOCK128
    d = p.to_dict()
    d["tensors"][1]["derive"] = "scales"  # the amax claims to be scales
    with pytest.raises(reshard.PlanError, match="amax and scales must be"):
        ReshardPlan.from_dict(d)
    d = p.to_dict()
    d["tensors"][0]["link"] = 0
    with pytest.raises(reshard.PlanError, match="scaled by tensor 0"):
        ReshardPlan.from_dict(d)
    d = p.to_dict()
    late = max(t["step"] for t in d["tasks"])
    for t in d["tasks"]:
        if t["tensor"] == 1:
            t["step"] = late
    d["tasks"].sort(key=lambda t: t["step"])
    with pytest.raises(reshard.PlanError, match="amax tasks"):
        ReshardPlan.from_dict(d)
    d = p.to_dict()
    d["tensors"][0]["cast"] = "int8"
    with pytest.raises(reshard.PlanError, match="cannot cast to int8"):
        ReshardPlan.from_dict(d)


def test_fused_sum_refused_for_narrow_dtypes():
    """A broadcast summing bf16 addends on the way would round per hop: the planner
    never fuses it and the verifier refuses one that does."""
    mesh = DeviceMesh((2, 2), [0, 1, 2, 3])
    p = reshard.plan((64, 64), "bfloat16", Layout(mesh, "S0R+P1"),
                     Layout(DeviceMesh((2,), [4, 5]), "RS0"), cluster=CL)
    assert not any(t.addends for t in p.tasks)
    assert any(t.kind is reshard.TaskKind.REDUCE and t.nbytes == 4 * math.prod(
        b - a for a, b in t.box) for t in p.tasks)  # reductions carry float32
    f = reshard.plan((64, 64), "float32", Layout(mesh, "S0R+P1"),
                     Layout(DeviceMesh((2,), [4, 5]), "RS0"), cluster=CL)
    if any(t.addends for t in f.tasks):  # the model fused the float32 one: relabel it
        d = f.to_dict()
        d["tensors"][0]["dtype"] = "bfloat16"
        for t in d["tasks"]:
            t["nbytes"] //= 2
        with pytest.raises(reshard.PlanError, match="cannot be fused"):
            ReshardPlan.from_dict(d)

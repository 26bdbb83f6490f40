"""Real LLM dtypes on gloo worker processes: bfloat16 and float8 move bit-exact,
bfloat16 / float16 partial sums equal the float32-then-round reference (also across
gloo's 256 KiB pieces and several hosts), and casts on the wire (fp32 -> bf16, bf16 ->
fp8 unscaled, per-tensor, 128 x 128 block, UE8M0 block and MXFP8 scales) deliver the
reference bit for bit
for sharded, replicated, uneven and overlapping layouts; the raw backend's MAX
reduction (a scaled cast's amax)."""

from __future__ import annotations

import traceback

import numpy as np
import pytest

from reshard import DeviceMesh, Layout
from reshard.dtypes import Cast, ScaleMode, parse_dtype

from ._helpers import check_cast, check_partial_sum, check_shards, rank_results

pytestmark = pytest.mark.cpu

H0 = DeviceMesh((2,), [0, 1])          # host 0
H01 = DeviceMesh((2, 2), [0, 1, 2, 3])  # hosts 0-1
H23 = DeviceMesh((2, 2), [4, 5, 6, 7])  # hosts 2-3
ROW = DeviceMesh((4,), [2, 3, 4, 5])    # hosts 1-2 (overlaps both)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16"])
def test_narrow_dtypes_move_bit_exact_on_gloo(rt, dtype):
    dt = parse_dtype(dtype)
    rng = np.random.default_rng(len(dtype))
    bits = {1: np.uint8, 2: np.uint16}[dt.itemsize]
    x = rng.integers(0, 1 << (8 * dt.itemsize), size=(77, 131)).astype(bits).view(dt)
    for src, dst, strategy in [(Layout(H01, "S0S1"), Layout(H23, "S1R"), "broadcast"),
                               (Layout(H0, "RS0"), Layout(ROW, "S0R"), "send_recv"),
                               (Layout(H01, "S01R"), Layout(H23, "RR"), "allgather")]:
        y = rt.reshard(rt.put(x, src), dst, strategy)
        assert y.dtype == dtype
        check_shards(rt, y, x)


PARTIALS = [  # (shape, source, destination): several pieces, chains over hosts
    ((300_000,), Layout(H01, "R+P01"), Layout(H23, "R")),
    ((513, 129), Layout(H01, "S0R+P1"), Layout(ROW, "RS0")),
    ((64, 9), Layout(H0, "RR+P0"), Layout(H01, "S1S0")),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", PARTIALS, ids=[f"{c[1].spec}->{c[2].spec}" for c in PARTIALS])
def test_narrow_partial_sums_on_gloo(rt, dtype, case):
    """Summed in float32 (the reductions carry float32), rounded once: the reference's
    bits, for every strategy."""
    shape, src, dst = case
    check_partial_sum(rt, shape, src, dst, dtype)


CASTS = [
    ("float32", Cast("bfloat16"), (1000, 300), Layout(H01, "S0S1"), Layout(H23, "RS0")),
    ("bfloat16", Cast("float8_e4m3fn"), (257, 3, 100), Layout(H0, "RS0R"),
     Layout(ROW, "S0RR")),
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.TENSOR), (300, 517), Layout(H01, "S1S0"),
     Layout(H23, "RR")),
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128), (300, 517), Layout(H01, "S0S1"),
     Layout(H23, "S1S0")),  # shards straddle blocks: amax reduced across hosts first
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128), (512, 1024), Layout(H01, "S0S1"),
     Layout(H23, "RS1")),  # whole blocks: each source its own scales
    ("float32", Cast("float8_e5m2", ScaleMode.BLOCK128), (2, 260, 140), Layout(H0, "RRR"),
     Layout(ROW, "RS0R")),  # replicated source, rank 3
    # the power-of-two formats: DeepGEMM's UE8M0 blocks and MXFP8 (E8M0 scales)
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128_UE8M0), (300, 517),
     Layout(H01, "S0S1"), Layout(H23, "S1S0")),  # blocks straddle shards: amax first
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128_UE8M0), (512, 1024),
     Layout(H01, "S0S1"), Layout(H23, "RS1")),  # whole blocks
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.MX32), (300, 517), Layout(H01, "S0S1"),
     Layout(H23, "RS0")),  # 259 / 258 columns a shard: 32-blocks straddle, amax first
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.MX32), (256, 512), Layout(H01, "S0S1"),
     Layout(H23, "S1R")),  # whole 32-blocks: each source its own scales
    ("float32", Cast("float8_e5m2", ScaleMode.MX32), (2, 260, 140), Layout(H0, "RRR"),
     Layout(ROW, "RS0R")),  # replicated source, rank 3, ragged last block
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASTS,
                         ids=[f"{c[0]}->{c[1]}-{c[3].spec}->{c[4].spec}" for c in CASTS])
def test_cast_on_the_wire_on_gloo(rt, case):
    check_cast(rt, *case)


def _max_main(device: int, address, results, done) -> None:
    try:
        from reshard.comm.backends.gloo import GlooBackend
        from reshard.dtypes import ReduceOp

        class _Plan:
            def communicator_groups(self):
                return ((0, 1, 2),)

        b = GlooBackend(device, (0, 1, 2), address.connect(10), 10.0)
        b.prepare(_Plan())
        buf = np.array([device, -device, 2.5 * (device == 1), 0.0], np.float32)
        b.reduce(buf, 2, (0, 1, 2), op=ReduceOp.MAX)
        b.close()
        results.put((device, {"max": buf}))
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((device, traceback.format_exc()))


@pytest.mark.timeout(120)
def test_gloo_max_reduction():
    got = rank_results(_max_main, (0, 1, 2), wait=60, join=10)
    assert got[2]["max"].tolist() == [2.0, 0.0, 2.5, 0.0]

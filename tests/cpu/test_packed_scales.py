"""Packed fp8 scales as engines lay them out (reshard.packed, ``Cast(..., fold=True)``).

A GQA model (32 q heads, 8 kv heads, hidden 320) at head_dim 64 and 128 moves from a
Megatron TP2 trainer's interleaved ``linear_qkv`` (bf16, strided views as sources) to
vLLM's packed ``qkv_proj`` and its ``weight_scale_inv`` at TP 1-16 (kv heads
replicated at TP16), in block128, block128-ue8m0 and mx32. The reference quantizes
each 2-D projection (``q_proj [4096 or 2048, 320]``, ``k_proj``, ``v_proj``) with
:func:`reshard.casting.reference_cast` and packs rank ``r``'s rows and scales as vLLM's
``QKVParallelLinear.weight_loader_v2`` does: every byte must match. Where a part's rows
on a rank are not whole 128-row blocks (head_dim 64 at TP8 and TP16: k and v hold 64
rows), the packing is refused naming the part, as vLLM's ``validate_fp8_block_shape``
refuses the layer. Megatron's ``linear_qkv`` as a destination is checked against a 2-D
quantization of each rank's fused buffer (Transformer Engine's blockwise layout)."""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest

import reshard
from reshard import Cluster
from reshard.casting import reference_cast
from reshard.comm.backends.local import LocalBackend, LocalFabric
from reshard.comm.executor import Executor
from reshard.comm.program import programs
from reshard.dtypes import Cast, ScaleMode, parse_dtype, scale_grid
from reshard.errors import ReshardError
from reshard.packed import Attention, Packing, shard_shapes

pytestmark = pytest.mark.cpu

PARTS = ("q", "k", "v")
MODES = (ScaleMode.BLOCK128, ScaleMode.BLOCK128_UE8M0, ScaleMode.MX32)
FP8 = "float8_e4m3fn"
TRAIN_TP = 2


def _model(head_dim: int) -> Attention:
    return Attention(heads=32, kv_heads=8, head_dim=head_dim, hidden=320)


def _weights(attn: Attention) -> dict[str, np.ndarray]:
    """Each projection in grouped coordinates (bf16; blocks of unequal magnitude, so
    that a block's scale depends on which rows it spans)."""
    rng = np.random.default_rng(attn.head_dim)
    out = {}
    for p, shape in attn.shapes().items():
        rows = np.arange(shape[0] * shape[1]).reshape(shape[0], shape[1], 1)
        x = rng.standard_normal(shape) * (1 + rows % 97) / 7
        out[p] = x.astype(ml_dtypes.bfloat16)
    return out


def _run(plan, world, sources, outs) -> None:
    """Every device of ``world`` a thread with its executor on one local fabric."""
    fabric = LocalFabric(timeout=60)
    progs = programs(plan, world)
    errors: list[BaseException] = []

    def rank(d: int) -> None:
        try:
            ex = Executor(LocalBackend(d, fabric))
            lp = ex.load(progs[d])
            ex.run(lp, sources.get(d), out=outs(d, lp) if d in outs.ranks else None).wait()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            fabric.closed.set()

    threads = [threading.Thread(target=rank, args=(d,)) for d in world]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert not errors, errors


class Engine:
    """Engine ranks' fused buffers (weights and scales), viewed as the parts' shards."""

    def __init__(self, attn: Attention, packing: Packing, mode: ScaleMode, layouts,
                 ranks: list[int]) -> None:
        self.ranks = set(ranks)
        self.attn, self.packing, self.mode, self.layouts = attn, packing, mode, layouts
        self.scale_packing = packing.scales(mode)
        shape = packing.shape((attn.hidden,))
        self.weight = {d: np.zeros(shape, parse_dtype(FP8)) for d in ranks}
        self.scale = {d: np.zeros(scale_grid(shape, mode), parse_dtype(mode.scale_dtype))
                      for d in ranks}

    def __call__(self, d: int, lp) -> dict[int, np.ndarray]:
        """``out=`` of rank ``d``: each part's view of its qkv_proj and of its scales."""
        values = self.packing.views(self.weight[d],
                                    shard_shapes(self.attn.shapes(), self.layouts, d))
        dests = [x for x in lp.destinations()]
        scale_shards = {PARTS[x.request]: x.shape for x in dests if x.kind == "scales"}
        scales = self.scale_packing.views(self.scale[d], scale_shards)
        out = {}
        for x in dests:
            part = PARTS[x.request]
            out[x.tensor] = values[part] if x.kind == "value" else scales[part]
        return out


def _megatron_sources(attn: Attention, weights, layouts) -> dict[int, list]:
    """Trainer rank r's Megatron linear_qkv shard (interleaved per group), and its
    parts' strided views (the sources)."""
    packing = attn.megatron_packing(TRAIN_TP)
    out = {}
    for r in range(TRAIN_TP):
        shards = shard_shapes(attn.shapes(), layouts, r)
        fused = np.zeros(packing.shape((attn.hidden,)), ml_dtypes.bfloat16)
        views = packing.views(fused, shards)
        for p in PARTS:
            box = layouts[p].boxes(attn.shapes()[p])[r]
            views[p][...] = weights[p][tuple(slice(a, b) for a, b in box)]
        out[r] = [views[p] for p in PARTS]
    return out


def _sync(attn: Attention, mode: ScaleMode, dst_tp: int, megatron: bool = False) -> tuple:
    """Megatron TP2 -> an engine at ``dst_tp`` (vLLM's packing, or Megatron's), in
    ``mode``: the engine and the weights."""
    weights = _weights(attn)
    train = attn.layouts(list(range(TRAIN_TP)))
    ranks = list(range(TRAIN_TP, TRAIN_TP + dst_tp))
    infer = attn.layouts(ranks)
    packing = attn.megatron_packing(dst_tp) if megatron else attn.engine_packing(dst_tp)
    engine = Engine(attn, packing, mode, infer, ranks)
    casts = attn.casts(Cast(FP8, mode))
    reqs = [(attn.shapes()[p], "bfloat16", train[p], infer[p], casts[p]) for p in PARTS]
    plan = reshard.plan_many(reqs, cluster=Cluster.regular(2, 16))
    _run(plan, list(range(TRAIN_TP + dst_tp)), _megatron_sources(attn, weights, train),
         engine)
    return engine, weights


def _vllm_rows(attn: Attention, tp: int, r: int) -> dict[str, slice]:
    """Rank ``r``'s rows of each 2-D projection, as vLLM loads them (kv parts from kv
    head ``r // replicas`` when tp exceeds the kv heads)."""
    d = attn.head_dim
    q = attn.heads // tp * d
    kv_heads = max(1, attn.kv_heads // tp)
    first = r * kv_heads if tp <= attn.kv_heads else r // (tp // attn.kv_heads)
    kv = slice(first * d, (first + kv_heads) * d)
    return {"q": slice(r * q, (r + 1) * q), "k": kv, "v": kv}


def _rows_of_scales(rows: slice, mode: ScaleMode) -> slice:
    step = 1 if mode is ScaleMode.MX32 else 128
    assert rows.start % step == 0 and rows.stop % step == 0
    return slice(rows.start // step, rows.stop // step)


CASES = [(d, tp, m) for d in (64, 128) for tp in (1, 2, 4, 8, 16) for m in MODES]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("head_dim,tp,mode", CASES,
                         ids=[f"hd{d}-tp{t}-{m.value}" for d, t, m in CASES])
def test_packed_scales_equal_a_2d_quantization_packed_as_vllm(head_dim, tp, mode):
    attn = _model(head_dim)
    refused = mode is not ScaleMode.MX32 and head_dim == 64 and tp >= 8
    if refused:  # k and v hold 64 rows a rank: no 128-row block of their own
        with pytest.raises(ReshardError, match=r"part 'k' has 64 rows on each rank, not a "
                                               r"multiple of 128.*validate_fp8_block_shape"):
            attn.engine_packing(tp).scales(mode)
        return
    engine, weights = _sync(attn, mode, tp)
    reference = {p: reference_cast(w.reshape(-1, attn.hidden), Cast(FP8, mode))
                 for p, w in weights.items()}
    for r, d in enumerate(sorted(engine.ranks)):
        rows = _vllm_rows(attn, tp, r)
        want_w = np.concatenate([reference[p][0][rows[p]] for p in PARTS])
        want_s = np.concatenate([reference[p][1][_rows_of_scales(rows[p], mode)]
                                 for p in PARTS])
        assert engine.weight[d].tobytes() == want_w.tobytes(), (r, "qkv_proj")
        assert engine.scale[d].shape == want_s.shape
        assert engine.scale[d].tobytes() == want_s.tobytes(), (r, "weight_scale_inv")


def test_head_dim_64_scales_of_grouped_parts_are_not_the_engines_unfolded():
    """Why ``fold``: the grouped k part (8, 64, h) blocked on its last two dims gets one
    64-row block per kv head, (8, 1, 3) scales; the engine's 2-D k_proj [512, h] has
    (4, 3), and its values differ too."""
    attn = _model(64)
    k = _weights(attn)["k"]
    plain, plain_s = reference_cast(k, Cast(FP8, ScaleMode.BLOCK128))
    folded, folded_s = reference_cast(k, Cast(FP8, ScaleMode.BLOCK128, fold=True))
    engine, engine_s = reference_cast(k.reshape(512, 320), Cast(FP8, ScaleMode.BLOCK128))
    assert plain_s.shape == (8, 1, 3) and engine_s.shape == (4, 3)
    assert folded_s.shape == (4, 1, 3) and folded_s.tobytes() == engine_s.tobytes()
    assert folded.tobytes() == engine.tobytes() != plain.tobytes()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES[:2], ids=lambda m: m.value)
def test_megatron_linear_qkv_scales_are_its_fused_buffers_blocks(mode):
    """Into Megatron's interleaved linear_qkv at TP4 (head_dim 128): each rank's fused
    buffer and its scales equal a 2-D 128 x 128 quantization of that rank's fused
    weight (Transformer Engine's blockwise layout, columns unpadded); at head_dim 64 the
    k part's 64 rows per group would share a block with v: refused, naming k."""
    attn = _model(128)
    engine, weights = _sync(attn, mode, 4, megatron=True)
    for r, d in enumerate(sorted(engine.ranks)):
        fused = np.concatenate([
            weights[p][g].astype(np.float32) for g in range(2 * r, 2 * r + 2) for p in PARTS])
        want_w, want_s = reference_cast(fused.astype(ml_dtypes.bfloat16), Cast(FP8, mode))
        assert engine.weight[d].tobytes() == want_w.tobytes()
        assert engine.scale[d].tobytes() == want_s.tobytes()
    with pytest.raises(ReshardError, match=r"part 'k' has 64 rows per group \(4 groups\)"):
        _model(64).megatron_packing(2).scales(mode)


def test_parts_that_no_fold_can_block_are_refused_naming_the_part():
    with pytest.raises(ReshardError, match=r"part 'k' of Attention.*head_dim=96.*no box"):
        Attention(heads=32, kv_heads=8, head_dim=96, hidden=256).casts(
            Cast(FP8, ScaleMode.BLOCK128))
    mx = Attention(heads=32, kv_heads=8, head_dim=96, hidden=256).casts(
        Cast(FP8, ScaleMode.MX32))
    assert all(not c.fold for c in mx.values())  # mx32 blocks lie within a row
    with pytest.raises(ReshardError, match="no per-row blocks"):
        _model(64).engine_packing(2).scales("tensor")

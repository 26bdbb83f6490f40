"""Production-scale RL weight syncs, modelled: real models' parameter shapes (from their
published configs, not their weights) moved from a trainer's pipeline-, tensor- and
expert-parallel layout to an inference engine's tensor- / expert-parallel layout.

Shapes follow each model's Hugging Face ``config.json``; the inference side stores an
MoE layer's experts stacked, as vLLM's fused-MoE layers do (``w13``: experts x 2 MLP
width x hidden, ``w2``: experts x hidden x MLP width). Layouts:

- trainer: pipeline stage ``s`` holds its layers (the embedding on the first stage, the
  final norm and ``lm_head`` on the last) on its own ``(dp, tp)`` mesh: column-parallel
  weights split their output dim over TP (``S1R``), row-parallel ones their input dim
  (``RS1``), the vocabulary over TP, replicated weights and norms ``R``; stacked experts
  split over every device of the stage (expert parallelism, ``S01RR``);
- engine: one ``(replicas, tp)`` mesh: the same TP splits on axis 1, replicated over
  replicas; experts split over every device (``S01RR``, expert parallelism across the
  whole engine).

:func:`production_cases` lists the cases; :func:`requests` gives one's plan_many
requests and cluster (disjoint meshes: the engine's devices follow the trainer's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reshard.cluster import Cluster
from reshard.dtypes import Cast, ScaleMode
from reshard.layout import Layout
from reshard.mesh import DeviceMesh
from reshard.microbench.suites.weight_sync import FP8_BLOCK
from reshard.packed import Attention
from reshard.presets import PRESETS

BF16 = "bfloat16"

TRAIN = {"column": "S1R", "row": "RS1", "vocab": "S1R", "experts": "S01RR"}
INFER = {"column": "S1R", "row": "RS1", "vocab": "S1R", "experts": "S01RR"}
"""Specs by parameter kind; norms and replicated weights are ``R`` on every dim."""


def spec(table: dict[str, str], kind: str, ndim: int) -> str:
    """The spec of a parameter of ``kind`` and rank ``ndim``."""
    return table.get(kind, "R" * ndim)


@dataclass(frozen=True)
class Model:
    """A decoder's parameter shapes (the fields of its ``config.json`` that set them).

    Attributes:
        name: model name.
        vocab, hidden, layers: vocabulary, width, decoder layers.
        heads, kv_heads, head_dim: attention heads (grouped-query: ``kv_heads``).
        mlp: dense MLP width.
        experts: routed experts per MoE layer (0: dense).
        moe_mlp: an expert's MLP width.
        dense_layers: the first layers that are dense in an MoE model.
        shared: shared experts per MoE layer (their MLP width ``moe_mlp`` each).
        mla: multi-head latent attention (DeepSeek-V3): ``(q_lora_rank, kv_lora_rank,
            qk_nope_head_dim, qk_rope_head_dim, v_head_dim)``; None: grouped-query.
        qk_norm: per-head q / k norms (Qwen3).
        tied: ``lm_head`` is the embedding (``tie_word_embeddings``): not a parameter
            of its own.
        source: where the numbers come from.
    """

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    experts: int = 0
    moe_mlp: int = 0
    dense_layers: int = 0
    shared: int = 0
    mla: tuple[int, int, int, int, int] | None = None
    qk_norm: bool = False
    tied: bool = False
    source: str = ""

    def layer(self, i: int) -> list[tuple[str, tuple[int, ...], str]]:
        """``(name, shape, kind)`` of decoder layer ``i``'s parameters."""
        h, p = self.hidden, f"layers.{i}."
        out: list[tuple[str, tuple[int, ...], str]] = [(p + "input_layernorm", (h,), "norm")]
        if self.mla is None:
            q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
            out += [(p + "q_proj", (q, h), "column"), (p + "k_proj", (kv, h), "column"),
                    (p + "v_proj", (kv, h), "column"), (p + "o_proj", (h, q), "row")]
            if self.qk_norm:
                out += [(p + "q_norm", (self.head_dim,), "norm"),
                        (p + "k_norm", (self.head_dim,), "norm")]
        else:
            ql, kvl, nope, rope, v = self.mla
            out += [(p + "q_a_proj", (ql, h), "replicated"),
                    (p + "q_a_layernorm", (ql,), "norm"),
                    (p + "q_b_proj", (self.heads * (nope + rope), ql), "column"),
                    (p + "kv_a_proj_with_mqa", (kvl + rope, h), "replicated"),
                    (p + "kv_a_layernorm", (kvl,), "norm"),
                    (p + "kv_b_proj", (self.heads * (nope + v), kvl), "column"),
                    (p + "o_proj", (h, self.heads * v), "row")]
        out.append((p + "post_attention_layernorm", (h,), "norm"))
        if not self.experts or i < self.dense_layers:
            out += [(p + "gate_proj", (self.mlp, h), "column"),
                    (p + "up_proj", (self.mlp, h), "column"),
                    (p + "down_proj", (h, self.mlp), "row")]
            return out
        e, m = self.experts, self.moe_mlp
        out += [(p + "router", (e, h), "replicated"),
                (p + "experts.w13", (e, 2 * m, h), "experts"),
                (p + "experts.w2", (e, h, m), "experts")]
        if self.shared:
            s = self.shared * m
            out += [(p + "shared.gate_proj", (s, h), "column"),
                    (p + "shared.up_proj", (s, h), "column"),
                    (p + "shared.down_proj", (h, s), "row")]
        return out

    def parameters(self) -> list[tuple[int, str, tuple[int, ...], str]]:
        """``(layer, name, shape, kind)`` of every parameter: the embedding as layer
        -1, the final norm and lm_head as layer ``layers``."""
        h = self.hidden
        out: list[tuple[int, str, tuple[int, ...], str]] = [
            (-1, "embed_tokens", (self.vocab, h), "vocab")]
        for i in range(self.layers):
            out += [(i, n, s, k) for n, s, k in self.layer(i)]
        out.append((self.layers, "norm", (h,), "norm"))
        if not self.tied:
            out.append((self.layers, "lm_head", (self.vocab, h), "vocab"))
        return out

    @property
    def num_parameters(self) -> int:
        """Elements of every parameter."""
        return sum(math.prod(s) for _, _, s, _ in self.parameters())


QWEN3_0_6B = Model("Qwen3-0.6B", vocab=151936, hidden=1024, layers=28, heads=16, kv_heads=8,
                   head_dim=128, mlp=3072, qk_norm=True, tied=True,
                   source="huggingface.co/Qwen/Qwen3-0.6B config.json")
QWEN3_32B = Model("Qwen3-32B", vocab=151936, hidden=5120, layers=64, heads=64, kv_heads=8,
                  head_dim=128, mlp=25600, qk_norm=True,
                  source="huggingface.co/Qwen/Qwen3-32B config.json")
QWEN3_235B = Model("Qwen3-235B-A22B", vocab=151936, hidden=4096, layers=94, heads=64,
                   kv_heads=4, head_dim=128, mlp=12288, experts=128, moe_mlp=1536,
                   qk_norm=True, source="huggingface.co/Qwen/Qwen3-235B-A22B config.json")
DEEPSEEK_V3 = Model("DeepSeek-V3", vocab=129280, hidden=7168, layers=61, heads=128,
                    kv_heads=128, head_dim=128, mlp=18432, experts=256, moe_mlp=2048,
                    dense_layers=3, shared=1, mla=(1536, 512, 128, 64, 128),
                    source="huggingface.co/deepseek-ai/DeepSeek-V3 config.json")
KIMI_K2 = Model("Kimi-K2", vocab=163840, hidden=7168, layers=61, heads=64, kv_heads=64,
                head_dim=128, mlp=18432, experts=384, moe_mlp=2048, dense_layers=1, shared=1,
                mla=(1536, 512, 128, 64, 128),
                source="huggingface.co/moonshotai/Kimi-K2-Instruct config.json")


@dataclass(frozen=True)
class Sync:
    """One production weight sync.

    Attributes:
        name: case name.
        model: the model.
        pp: trainer pipeline stages.
        stage: each stage's ``(dp, tp)`` mesh.
        engine: the engine's ``(replicas, tp)`` mesh.
        preset: the machines (:data:`reshard.PRESETS`).
        cast: the engine's linear weights' conversion (None: bfloat16).
        packed: the engine holds attention packed (vLLM's ``qkv_proj``: q, k and v in
            grouped coordinates, :class:`reshard.packed.Attention`; kv heads replicated
            where the engine's TP exceeds them); grouped-query models only.
        note: the topology's origin.
        published: a peer's published time for this transfer (theirs, on their
            hardware and setup), shown beside the model.
    """

    name: str
    model: Model
    pp: int
    stage: tuple[int, int]
    engine: tuple[int, int]
    preset: str
    cast: Cast | None = None
    packed: bool = False
    note: str = ""
    published: str = ""

    @property
    def train_devices(self) -> int:
        return self.pp * math.prod(self.stage)

    @property
    def devices(self) -> int:
        return self.train_devices + math.prod(self.engine)


def requests(sync: Sync) -> tuple[list[tuple], Cluster]:
    """``(shape, dtype, src, dst, cast)`` of every parameter, and the cluster: the
    trainer's stages on the first devices, the engine's right after."""
    per = math.prod(sync.stage)
    stages = [DeviceMesh(sync.stage, devices=range(s * per, (s + 1) * per))
              for s in range(sync.pp)]
    engine = DeviceMesh(sync.engine, devices=range(sync.train_devices, sync.devices))
    layers = sync.model.layers

    def stage_of(layer: int) -> int:
        return min(sync.pp - 1, max(0, layer) * sync.pp // layers)

    attn = None
    if sync.packed:
        m = sync.model
        if m.mla is not None:
            raise ValueError(f"{sync.name}: packed attention needs grouped-query heads")
        attn = Attention(m.heads, m.kv_heads, m.head_dim, m.hidden)
        grouped = attn.shapes()
        infer = attn.layouts(engine.devices, replicas=sync.engine[0])
        train = [attn.layouts(st.devices, replicas=sync.stage[0]) for st in stages]
    out: list[tuple] = []
    for layer, name, shape, kind in sync.model.parameters():
        cast = sync.cast if kind in ("column", "row") else None
        part = name.rsplit(".", 1)[-1][0] if attn is not None and \
            name.endswith(("q_proj", "k_proj", "v_proj")) else ""
        if part:  # the same weight in grouped coordinates, laid out as the packing needs
            out.append((grouped[part], BF16, train[stage_of(layer)][part], infer[part], cast))
            continue
        src = Layout(stages[stage_of(layer)], spec(TRAIN, kind, len(shape)))
        dst = Layout(engine, spec(INFER, kind, len(shape)))
        out.append((shape, BF16, src, dst, cast))
    g = PRESETS[sync.preset].devices_per_host
    return out, Cluster.preset(sync.preset, -(-sync.devices // g))


def production_cases() -> tuple[Sync, ...]:
    """The suite (topologies: NCCL M2N's benchmark configs, NeMo-RL's async setup, the
    Perplexity Kimi-K2 setup; see each case's note)."""
    return (
        Sync("qwen3-32b", QWEN3_32B, pp=4, stage=(2, 4), engine=(8, 4), preset="dgx-h100",
             note="NeMo-RL async: train TP4 PP4 DP2 on 4 H100 nodes -> generate TP4 DP8 "
                  "on 4 other nodes"),
        Sync("qwen3-235b", QWEN3_235B, pp=4, stage=(4, 4), engine=(8, 8), preset="dgx-h100",
             note="128 H100: train PP4 x (DP4 TP4, EP16) -> engine 8 x TP8, EP64"),
        Sync("deepseek-v3", DEEPSEEK_V3, pp=8, stage=(8, 8), engine=(4, 8), preset="dgx-h100",
             note="train EP64 PP8 (TP8 for dense weights) on 512 H100 -> engine TP8, EP32"),
        Sync("deepseek-v3-gb200", DEEPSEEK_V3, pp=4, stage=(4, 8), engine=(16, 8),
             preset="gb200-nvl72",
             note="256 GB200 (NVL72 racks): train PP4 x EP32 -> engine 16 x TP8, EP128"),
        Sync("kimi-k2", KIMI_K2, pp=8, stage=(4, 8), engine=(16, 8), preset="dgx-h100",
             note="256 trainer GPUs -> 128 inference GPUs (the Perplexity setup)"),
        Sync("kimi-k2-fp8", KIMI_K2, pp=8, stage=(4, 8), engine=(16, 8), preset="dgx-h100",
             cast=FP8_BLOCK, note="as kimi-k2, the dense linear weights cast to block fp8"),
        # engine formats (packed attention, fp8 scale formats) at production scale
        Sync("qwen3-32b-packed-fp8", QWEN3_32B, pp=4, stage=(2, 4), engine=(8, 4),
             preset="dgx-h100", cast=FP8_BLOCK, packed=True,
             note="as qwen3-32b (nccl_m2n qwen3-32b-tp4pp4dp2-to-tp4dp8-64gpus-h100), the "
                  "engine's packed qkv_proj, linear weights to block fp8"),
        Sync("qwen3-235b-packed-ue8m0", QWEN3_235B, pp=4, stage=(4, 4), engine=(8, 8),
             preset="dgx-h100", cast=Cast("float8_e4m3fn", ScaleMode.BLOCK128_UE8M0),
             packed=True,
             note="as qwen3-235b, packed qkv_proj at TP8 over 4 kv heads (each on 2 "
                  "ranks), UE8M0 block scales (DeepGEMM on Blackwell)"),
        Sync("deepseek-v3-gb200-mx32", DEEPSEEK_V3, pp=4, stage=(4, 8), engine=(16, 8),
             preset="gb200-nvl72", cast=Cast("float8_e4m3fn", ScaleMode.MX32),
             note="as deepseek-v3-gb200 (nccl_m2n dsv3-256gpus-gb200), dense linear "
                  "weights to MXFP8"),
        Sync("deepseek-v3-nemo-rl-h100", DEEPSEEK_V3, pp=16, stage=(1, 16), engine=(8, 32),
             preset="dgx-h100",
             note="NeMo-RL's M2N refit: BF16 PP16 x EP16 -> TP32 x DP8 (here 256 trainer + "
                  "256 engine H100, disjoint)",
             published="NeMo-RL M2N refit 2.39-2.83 s on H100 (theirs)"),
        Sync("deepseek-v3-nemo-rl-gb200", DEEPSEEK_V3, pp=16, stage=(1, 16), engine=(8, 32),
             preset="gb200-nvl72",
             note="as deepseek-v3-nemo-rl-h100 on GB200 NVL72",
             published="NeMo-RL M2N refit 1.93-2.59 s on GB200 (theirs)"),
    )


__all__ = ["DEEPSEEK_V3", "KIMI_K2", "QWEN3_0_6B", "QWEN3_32B", "QWEN3_235B", "Model", "Sync",
           "production_cases", "requests"]

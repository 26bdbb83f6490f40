"""RL post-training weight sync: a whole model's parameters, from the trainer's FSDP
layout to the inference engine's tensor-parallel layout, planned together in one
:func:`reshard.plan_many`.

The trainer shards every parameter on dim 0 over all its devices (FSDP / ZeRO-3:
spec ``S01R`` on a (hosts, gpus) mesh, ``S01`` for 1-D norm weights). The inference
engine runs replicas of a Megatron-style TP group on another, disjoint mesh: axis 0
the replica (replicated), axis 1 the TP rank. Column-parallel weights (q, k, v, gate,
up) split their output dim 0 over TP (``S1R``), row-parallel ones (o, down) their
input dim 1 (``RS1``), embedding and lm_head split the vocabulary (``S1R``), norms are
replicated (``R``).

Default: Llama-2-7B (vocab 32000, hidden 4096, 32 layers, 32 heads, MLP 11008; 291
tensors, 6.74e9 parameters, bfloat16) trained on 4 DGX H100 hosts (32 GPUs)
and served by 2 replicas of TP=8 on a (2, 8) mesh of 2 more hosts.

:func:`weight_sync_requests` gives the request list and the cluster to other code (a
testbed benchmark); :func:`weight_sync_cases` the ``weight-sync`` suite: the whole
model and a 2-layer slice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from reshard.cluster import Cluster
from reshard.dtypes import Cast, ScaleMode
from reshard.microbench.suites.paper import Case, Request, Tensor

BF16 = "bfloat16"


@dataclass(frozen=True)
class DecoderShape:
    """A Llama-style decoder transformer's parameter shapes.

    Attributes:
        name: model name.
        vocab: vocabulary size (embedding and lm_head rows).
        hidden: model width (q/k/v/o are hidden x hidden; no grouped-query attention).
        layers: decoder layers.
        heads: attention heads (they do not change the shapes; kept for the record).
        mlp: MLP width (gate/up are mlp x hidden, down is hidden x mlp).
    """

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    mlp: int

    def sliced(self, layers: int) -> DecoderShape:
        """The model cut to its first ``layers`` decoder layers (embedding, final norm and
        lm_head kept)."""
        return replace(self, name=f"{self.name}[{layers} layers]", layers=layers)

    def narrowed(self, divisor: int) -> DecoderShape:
        """Every width (vocab, hidden, MLP) divided by ``divisor`` (rounded up): the same
        tensors and layouts, smaller (for machines that move real bytes slowly)."""
        def d(n: int) -> int:
            return -(-n // divisor)
        return replace(self, name=f"{self.name}/{divisor}", vocab=d(self.vocab),
                       hidden=d(self.hidden), mlp=d(self.mlp))

    def parameters(self) -> list[tuple[str, tuple[int, ...], str]]:
        """``(name, shape, kind)`` of every parameter in checkpoint order; ``kind`` is
        ``"column"``, ``"row"``, ``"vocab"`` or ``"norm"`` (how inference splits it)."""
        h, m = self.hidden, self.mlp
        out: list[tuple[str, tuple[int, ...], str]] = [
            ("embed_tokens", (self.vocab, h), "vocab")]
        for i in range(self.layers):
            p = f"layers.{i}."
            out += [(p + "input_layernorm", (h,), "norm"),
                    (p + "q_proj", (h, h), "column"), (p + "k_proj", (h, h), "column"),
                    (p + "v_proj", (h, h), "column"), (p + "o_proj", (h, h), "row"),
                    (p + "post_attention_layernorm", (h,), "norm"),
                    (p + "gate_proj", (m, h), "column"), (p + "up_proj", (m, h), "column"),
                    (p + "down_proj", (h, m), "row")]
        out += [("norm", (h,), "norm"), ("lm_head", (self.vocab, h), "vocab")]
        return out

    @property
    def num_parameters(self) -> int:
        """Parameter count (elements of all tensors)."""
        return sum(math.prod(s) for _, s, _ in self.parameters())


LLAMA2_7B = DecoderShape("Llama-2-7B", vocab=32000, hidden=4096, layers=32, heads=32,
                         mlp=11008)

TRAIN_SPEC = {1: "S01", 2: "S01R"}  # FSDP: dim 0 over every training device
INFER_SPEC = {"column": "S1R", "row": "RS1", "vocab": "S1R", "norm": "R"}  # TP on axis 1


FP8_BLOCK = Cast("float8_e4m3fn", ScaleMode.BLOCK128)
"""The inference engine's weights: float8 e4m3 with 128 x 128 block scales (DeepSeek-V3's
format, which vLLM and SGLang load)."""

QUANTIZED = frozenset({"column", "row"})
"""The parameter kinds a block-fp8 engine loads as float8: the linear layers; the
embedding, lm_head and norms stay bfloat16."""


def weight_sync_tensors(model: DecoderShape = LLAMA2_7B, dtype: str = BF16,
                        cast: Cast | None = None) -> list[Tensor]:
    """Every parameter as a :class:`Tensor`: FSDP spec -> TP spec; with ``cast``, the
    linear layers (:data:`QUANTIZED`) are converted on the way."""
    return [Tensor(shape, dtype, TRAIN_SPEC[len(shape)], INFER_SPEC[kind], name,
                   cast if kind in QUANTIZED else None)
            for name, shape, kind in model.parameters()]


def weight_sync_case(name: str, model: DecoderShape = LLAMA2_7B, dtype: str = BF16,
                     train_mesh: tuple[int, int] = (4, 8),
                     infer_mesh: tuple[int, int] = (2, 8),
                     preset: str | None = "dgx-h100", cast: Cast | None = None) -> Case:
    """The sync of ``model`` from FSDP on ``train_mesh`` to TP (replicas x TP degree) on
    a disjoint ``infer_mesh`` as one case of several tensors (``cast``: of the linear
    layers, e.g. :data:`FP8_BLOCK`)."""
    return Case.many(name, weight_sync_tensors(model, dtype, cast), train_mesh, infer_mesh,
                     preset=preset, labels=("fsdp:S01", "tp:S1/RS1/R"))


def weight_sync_requests(model: DecoderShape = LLAMA2_7B, dtype: str = BF16,
                         train_mesh: tuple[int, int] = (4, 8),
                         infer_mesh: tuple[int, int] = (2, 8),
                         preset: str | None = "dgx-h100",
                         cluster: Cluster | None = None) -> tuple[list[Request], Cluster]:
    """The requests ``(shape, dtype, src_layout, dst_layout)`` of a weight sync and the
    cluster they are placed on (given, or ``preset`` machines just enough for both
    meshes): ready for :func:`reshard.plan_many` or ``Runtime.reshard_many``.

    The training mesh takes the first ``train_mesh[1]`` devices of hosts
    ``0 .. train_mesh[0]-1``, the inference mesh those of the next ``infer_mesh[0]``
    hosts.
    """
    case = weight_sync_case("weight-sync", model, dtype, train_mesh, infer_mesh, preset)
    if cluster is None:
        return case.build_many()
    return case.requests_on(cluster), cluster


SLICE_LAYERS = 2


def weight_sync_cases() -> tuple[Case, ...]:
    """The ``weight-sync`` suite: Llama-2-7B whole (291 tensors, 13.5 GB) and a 2-layer
    slice (21 tensors), FSDP on (4, 8) -> 2 x TP=8 on (2, 8), DGX H100; each in bf16 and
    to a block-fp8 engine (the linear layers cast to float8 e4m3 with 128 x 128 block
    scales at the source, ``-fp8``)."""
    sliced = LLAMA2_7B.sliced(SLICE_LAYERS)
    return (weight_sync_case("weight-sync-7b"),
            weight_sync_case("weight-sync-7b-fp8", cast=FP8_BLOCK),
            weight_sync_case(f"weight-sync-{SLICE_LAYERS}l", sliced),
            weight_sync_case(f"weight-sync-{SLICE_LAYERS}l-fp8", sliced, cast=FP8_BLOCK))


SUITES = {"weight-sync": weight_sync_cases}

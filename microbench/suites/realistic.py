"""Layout pairs that real training runs produce, at the sizes they have there.

Every case names the model whose activations or parameters it moves. Meshes are
(hosts, devices per host); axis 0 is the data-parallel / pipeline axis across hosts,
axis 1 the tensor-parallel (TP) axis inside a host (Megatron's placement). Tensors
are bfloat16 (partial sums of it are reduced in float32: :mod:`reshard.dtypes`).

Model shapes used (hidden size / MLP size / vocabulary):

* GPT-2 medium: hidden 1024.
* GPT-3 1.3B: hidden 2048.
* Llama-2-7B: hidden 4096, MLP 11008, vocabulary 32000.
* Llama-2-13B: hidden 5120, MLP 13824.
* Llama-2-70B: hidden 8192, MLP 28672, vocabulary 32000.

Families: all-to-all transposes; Megatron tensor-parallel stage boundaries
(column-parallel outputs split over the TP axis, row-parallel outputs as partial sums);
replicated -> sharded over overlapping meshes; 1-to-m at 64-256 GPUs; unequal meshes
and uneven shapes; on the paper's p3.8xlarge, DGX H100, p4d.24xlarge and p5.48xlarge.
"""

from __future__ import annotations

from reshard.microbench.suites.paper import Case

BF16 = "bfloat16"
P4D, P5, H100 = "aws-p4d.24xlarge", "aws-p5.48xlarge", "dgx-h100"


def _transposes() -> tuple[Case, ...]:
    """All-to-all transposes."""
    return (
        # Llama-2-70B activations, 32768 tokens x hidden 8192: token-split stage (each
        # host a block of tokens) -> hidden-split stage, 16 hosts each side (512 MiB).
        Case("a2a-16x8", (32768, 8192), BF16, (16, 8), "S0R", (16, 8), "RS0", preset=P4D),
        # Llama-2-7B activations, micro-batch 4 x 4096 tokens x hidden 4096, split over
        # all 32 GPUs by tokens -> by hidden: a true 32 -> 32 all-to-all (128 MiB).
        Case("a2a-flat-4x8", (16384, 4096), BF16, (4, 8), "S01R", (4, 8), "RS10",
             preset=H100),
        # GPT-2 medium activations, 8 x 1024 tokens x hidden 1024, fp32 (32 MiB): the
        # emulated testbed's size (3 hosts of 2 workers each side).
        Case("a2a-testbed-3x2", (8192, 1024), "float32", (3, 2), "S0R", (3, 2), "RS0"),
    )


def _stage_boundaries() -> tuple[Case, ...]:
    """Megatron tensor-parallel stage boundaries."""
    return (
        # Llama-2-13B, batch 4 x seq 4096 x hidden 5120: a column-parallel output (batch
        # over DP axis 0, hidden over TP axis 1) -> the next stage, replicated over TP
        # (it starts with a norm) (160 MiB).
        Case("tp-col-to-rep-2x8", (4, 4096, 5120), BF16, (2, 8), "S0RS1", (2, 8), "S0RR",
             preset=P4D),
        # Llama-2-70B, batch 4 x seq 4096 x hidden 8192: column-parallel output -> the
        # next stage sequence-parallel (Megatron-SP: sequence over TP) (256 MiB).
        Case("tp-col-to-seqpar-4x8", (4, 4096, 8192), BF16, (4, 8), "S0RS1", (4, 8),
             "S0S1R", preset=H100),
        # Llama-2-13B MLP up-projection output (4 x 4096 x 13824): a TP=8 stage -> a
        # TP=4 stage (heterogeneous pipeline stages) (432 MiB).
        Case("tp8-to-tp4", (4, 4096, 13824), BF16, (2, 8), "S0RS1", (2, 4), "S0RS1",
             preset=P4D),
        # Llama-2-7B row-parallel (o_proj / down_proj) output before its all-reduce:
        # 16384 tokens x 4096, fp32 partial sums over TP -> next stage, reduced and
        # replicated over TP (256 MiB).
        Case("tp-row-partial-to-rep", (16384, 4096), "float32", (2, 8), "S0R+P1", (2, 8),
             "S0R", preset=P4D),
        # GPT-3 1.3B row-parallel output, 8192 tokens x hidden 2048, fp16 partial sums,
        # replicated over DP -> hidden split over the next stage's hosts (32 MiB), on the
        # paper's cluster.
        Case("tp-row-rrp1-to-rs0", (8192, 2048), "float16", (2, 4), "RR+P1", (2, 4), "RS0"),
        # Llama-2-70B row-parallel output, 16384 tokens x 8192, fp32 partial sums on DGX
        # H100 (512 MiB).
        Case("partial-h100-4x8", (16384, 8192), "float32", (4, 8), "S0R+P1", (4, 8), "RS0",
             preset=H100),
    )


def _overlapping_meshes() -> tuple[Case, ...]:
    """Replicated -> sharded over overlapping meshes."""
    return (
        # Llama-2-7B up_proj weight (11008 x 4096, fp32 master copy), data-parallel
        # replicated on 2 hosts -> ZeRO-style sharded over 4 hosts that include the
        # source's second host (172 MiB).
        Case("rep-to-shard-overlap", (11008, 4096), "float32", (2, 8), "RR", (4, 8), "RS0",
             preset=P4D, dst_first_host=1),
        # Llama-2-7B embedding (32000 x 4096, fp32) replicated on 2 hosts -> sharded over
        # 4 hosts whose first two are the source's (same devices: local copies) (500 MiB).
        Case("rep-to-shard-same-hosts", (32000, 4096), "float32", (2, 8), "RR", (4, 8),
             "RS0", preset=H100, dst_first_host=0),
    )


def _one_to_many() -> tuple[Case, ...]:
    """1-to-m at 64-256 GPUs."""
    return (
        # Llama-2-7B embedding (32000 x 4096 bf16, 250 MiB) loaded on one GPU ->
        # replicated on every GPU.
        Case("1-to-64", (32000, 4096), BF16, (1, 1), "RR", (8, 8), "RR", preset=P4D),
        Case("1-to-128", (32000, 4096), BF16, (1, 1), "RR", (16, 8), "RR", preset=H100),
        # Llama-2-70B embedding (32000 x 8192 bf16, 500 MiB).
        Case("1-to-256", (32000, 8192), BF16, (1, 1), "RR", (32, 8), "RR", preset=P5),
    )


def _uneven() -> tuple[Case, ...]:
    """Unequal meshes, uneven shapes."""
    return (
        # Llama-2-13B activations, 12288 tokens x 5120: 3 hosts -> 5 hosts (120 MiB).
        Case("unequal-3x8-to-5x8", (12288, 5120), BF16, (3, 8), "S0R", (5, 8), "RS0",
             preset=P4D),
        # An odd-sized fp16 matrix (12345 x 777): chunks of 6173/6172 rows -> 65 columns
        # each, the last of 12 shards short (18 MiB).
        Case("uneven-12345x777", (12345, 777), "float16", (2, 4), "S0R", (3, 4), "RS01"),
        # Odd dims everywhere (127 x 1031 x 33 fp32); 33 split 12 ways leaves the last
        # shard empty (torch.chunk rule) (16 MiB).
        Case("uneven-odd-3d", (127, 1031, 33), "float32", (2, 4), "S0S1R", (3, 4), "RRS01"),
    )


def _parameters() -> tuple[Case, ...]:
    """Parameters between parallelisms."""
    return (
        # Llama-2-70B down_proj weight (8192 x 28672 bf16, 448 MiB): tensor-parallel
        # row-parallel (input dim over TP) -> FSDP (dim 0 over all 32 GPUs), on p5.
        Case("tp-to-fsdp-p5", (8192, 28672), BF16, (2, 8), "RS1", (4, 8), "S01R", preset=P5),
    )


def realistic_cases() -> tuple[Case, ...]:
    """The realistic suite (18 cases)."""
    return (*_transposes(), *_stage_boundaries(), *_overlapping_meshes(), *_one_to_many(),
            *_uneven(), *_parameters())


SUITES = {"realistic": realistic_cases}

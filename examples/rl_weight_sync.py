"""RL weight sync: a transformer's state dict from FSDP training ranks to tensor-parallel
inference ranks, with ``reshard.adapters.dtensor.redistribute_many``.

Ranks 0-3 train: every parameter is a DTensor ``[Shard(0)]`` on their mesh (FSDP's
layout). Ranks 4-7 serve: the inference engine wants Megatron's tensor-parallel layout
on their mesh: column-parallel weights (attention qkv, MLP up, LM head) split on
their output dim ``[Shard(0)]``, row-parallel ones (attention out, MLP down) on their
input dim ``[Shard(1)]``, the vocabulary-parallel embedding on its rows, norms
replicated. After each training step the whole state dict moves with one reshard
plan (one load balance over all tensors, no full copy anywhere); the plan is made and
loaded once, so later syncs cost only the transfer. Every inference shard is checked
against the full weights, sliced by DTensor's own placement rule.

With ``--fp8`` the trainer holds bfloat16 weights and the engine takes what an fp8
engine takes: every matrix (embedding, projections, LM head) as float8_e4m3fn with
float32 scales per 128 x 128 block, the biases and norms (rank 1) as bfloat16, all in
one plan, by a rule per tensor; each fp8 shard and its scales are checked against the
reference cast of the full weights.

Run: ``python examples/rl_weight_sync.py`` (CPU, torch with gloo). On a 2-core machine
most of its time is the 8 processes starting (each imports torch: they joined after
17 s, 37 s in all, at a load average of 3.5-5.6; 30-70 s on a busier machine); it
prints when they have joined, each sync, and when it shuts them down.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor

from reshard.adapters.dtensor import redistribute_many
from reshard.core.cliargs import add_version

WORLD = 8
TRAIN = (0, 1, 2, 3)
INFER = (4, 5, 6, 7)


class Block(nn.Module):
    """A pre-norm transformer block (the parameters are what matters here)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attention (one head, causal) then the MLP."""
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        x = x + self.out(nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))


class TinyTransformer(nn.Module):
    """Embedding, ``layers`` blocks, final norm, LM head."""

    def __init__(self, vocab: int = 1000, dim: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits."""
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


COLUMN = ("qkv", "up", "head")  # output features split: weight and bias [Shard(0)]
ROW = ("out", "down")  # input features split: weight [Shard(1)], bias replicated


def tp_placements(name: str) -> list[Placement]:
    """Megatron's tensor-parallel placement of parameter ``name`` on a 1-D mesh."""
    module, _, kind = name.rpartition(".")
    leaf = module.rpartition(".")[2]
    if leaf in COLUMN or leaf == "embed":
        return [Shard(0)]
    if leaf in ROW and kind == "weight":
        return [Shard(1)]
    return [Replicate()]


def full_weights(vocab: int, dim: int, layers: int, step: int,
                 dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The model's weights after ``step`` training steps (the same in every process:
    the seeded initial model in ``dtype``, then a deterministic update per step)."""
    torch.manual_seed(0)
    state = {n: t.to(dtype) for n, t in TinyTransformer(vocab, dim, layers).state_dict().items()}
    for _ in range(step):  # the same float additions the training ranks make
        for t in state.values():
            t.add_(0.5)
    return state


def check_shard(rank: int, step: int, name: str, got: object, full: torch.Tensor,
                mesh: DeviceMesh, placements: list[Placement]) -> None:
    """``got`` (a DTensor, or an fp8 one and its scales) against ``full`` sliced by
    DTensor's rule (fp8: the reference cast of ``full``, and its scales)."""
    if isinstance(got, tuple):
        from reshard.core.casting import reference_cast
        from reshard.core.dtypes import Cast, ScaleMode, numpy_of_torch, torch_of_numpy

        values, scales = got
        ref_q, ref_s = reference_cast(numpy_of_torch(full),
                                      Cast("float8_e4m3fn", ScaleMode.BLOCK128))
        pairs = [(values, torch_of_numpy(ref_q), placements),
                 (scales, torch_of_numpy(ref_s), list(scales.placements))]
    else:
        pairs = [(got, full, placements)]
    for dt, whole, pl in pairs:
        expect = distribute_tensor(whole, mesh, pl, src_data_rank=None).to_local()
        assert isinstance(dt, DTensor) and tuple(dt.placements) == tuple(pl)
        mine, theirs = dt.to_local().contiguous(), expect.contiguous()
        if mine.dtype != theirs.dtype:
            raise AssertionError(f"rank {rank}: step {step}: {name} is {mine.dtype}, "
                                 f"not {theirs.dtype}")
        if mine.dtype == torch.float8_e4m3fn:  # compared bit for bit
            mine, theirs = mine.view(torch.uint8), theirs.view(torch.uint8)
        if not torch.equal(mine, theirs):
            raise AssertionError(f"rank {rank}: step {step}: {name} differs")


def rank_main(rank: int, store_path: str, args: argparse.Namespace, t0: float) -> None:
    """One rank: FSDP shards (training) or TP shards (inference), and every sync
    (``t0``: when the run started, for the progress lines)."""
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=WORLD)
    if rank == 0:
        print(f"all {WORLD} processes joined ({time.time() - t0:.0f} s); syncing "
              f"{args.steps} times ...", flush=True)
    try:
        torch.set_num_threads(1)
        train = DeviceMesh("cpu", torch.tensor(TRAIN), mesh_dim_names=("fsdp",))
        infer = DeviceMesh("cpu", torch.tensor(INFER), mesh_dim_names=("tp",))
        dtype = torch.bfloat16 if args.fp8 else torch.float32
        full = full_weights(args.vocab, args.dim, args.layers, 0, dtype)
        # FSDP: dim 0 of every parameter over the training ranks (DTensor's chunk rule)
        state = {n: distribute_tensor(t, train, [Shard(0)], src_data_rank=None)
                 for n, t in full.items()}
        placements = {n: tp_placements(n) for n in state}
        times = []
        for step in range(args.steps):
            if rank in TRAIN and step:  # the training step updates the local shards
                for dt in state.values():
                    dt.to_local().add_(0.5)
            dist.barrier()
            t0 = time.perf_counter()
            if args.fp8:  # matrices to fp8 with block scales, the rest as they are
                synced = redistribute_many(
                    state, infer, placements, strategy=args.strategy,
                    cast=lambda n, t: "float8_e4m3fn" if t.ndim >= 2 else None,
                    scale=lambda n, t: "block128" if t.ndim >= 2 else None)
            else:
                synced = redistribute_many(state, infer, placements, strategy=args.strategy)
            times.append(time.perf_counter() - t0)
            if rank in INFER:
                want = full_weights(args.vocab, args.dim, args.layers, step, dtype)
                for n, got in synced.items():
                    check_shard(rank, step, n, got, want[n], infer, placements[n])
                if rank == INFER[0]:  # a sign of life per sync
                    print(f"sync {step + 1}/{args.steps}: {len(synced)} tensors exact, "
                          f"{times[-1] * 1e3:.0f} ms", flush=True)
        if rank == INFER[0]:
            nbytes = sum(t.numel() * t.element_size() for t in full.values())
            again = statistics.median(times[1:]) if len(times) > 1 else float("nan")
            kind = ("bf16 -> fp8 matrices with block scales, bf16 biases and norms, "
                    if args.fp8 else "")
            print(f"{len(full)} tensors, {nbytes / 1e6:.1f} MB: FSDP on ranks {list(TRAIN)} -> "
                  f"TP on ranks {list(INFER)}, {kind}every shard equal to the full weights'"
                  f"{' reference cast' if args.fp8 else ''}; "
                  f"first sync {times[0] * 1e3:.0f} ms (plan + load + transfer), later syncs "
                  f"{again * 1e3:.0f} ms (median of {len(times) - 1})", flush=True)
        dist.barrier()
        if rank == 0:
            print(f"shutting the {WORLD} processes down ...", flush=True)
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Run the syncs on 8 processes; 0 when every shard matched."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_version(ap)
    ap.add_argument("--vocab", type=int, default=1000, help="vocabulary (default 1000)")
    ap.add_argument("--dim", type=int, default=128, help="model width (default 128)")
    ap.add_argument("--layers", type=int, default=2, help="blocks (default 2)")
    ap.add_argument("--steps", type=int, default=4, help="training steps, one sync each")
    ap.add_argument("--strategy", default="broadcast",
                    help="reshard strategy: broadcast, send_recv, allgather (default broadcast)")
    ap.add_argument("--fp8", action="store_true",
                    help="bfloat16 trainer, fp8 engine: matrices as float8_e4m3fn with "
                         "128 x 128 block scales, biases and norms as bfloat16, one plan")
    args = ap.parse_args(argv)
    t0 = time.time()
    print(f"starting {WORLD} gloo processes (each imports torch: 15-70 s on 2 cores) ...",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(rank_main, args=(os.path.join(tmp, "store"), args, t0), nprocs=WORLD,
                 join=True)
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

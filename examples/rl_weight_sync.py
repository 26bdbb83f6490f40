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

Run: ``python examples/rl_weight_sync.py`` (CPU, torch with gloo; about 30 s).
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
from reshard.cliargs import add_version

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


def full_weights(vocab: int, dim: int, layers: int, step: int) -> dict[str, torch.Tensor]:
    """The model's weights after ``step`` training steps (the same in every process:
    the seeded initial model, then a deterministic update per step)."""
    torch.manual_seed(0)
    state = {n: t.clone() for n, t in TinyTransformer(vocab, dim, layers).state_dict().items()}
    for _ in range(step):  # the same float additions the training ranks make
        for t in state.values():
            t.add_(0.5)
    return state


def rank_main(rank: int, store_path: str, args: argparse.Namespace) -> None:
    """One rank: FSDP shards (training) or TP shards (inference), and every sync."""
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=WORLD)
    try:
        torch.set_num_threads(1)
        train = DeviceMesh("cpu", torch.tensor(TRAIN), mesh_dim_names=("fsdp",))
        infer = DeviceMesh("cpu", torch.tensor(INFER), mesh_dim_names=("tp",))
        full = full_weights(args.vocab, args.dim, args.layers, 0)
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
            synced = redistribute_many(state, infer, placements, strategy=args.strategy)
            times.append(time.perf_counter() - t0)
            if rank in INFER:
                want = full_weights(args.vocab, args.dim, args.layers, step)
                for n, dt in synced.items():
                    expect = distribute_tensor(want[n], infer, placements[n],
                                               src_data_rank=None).to_local()
                    assert isinstance(dt, DTensor) and tuple(dt.placements) == tuple(placements[n])
                    if not torch.equal(dt.to_local(), expect):
                        raise AssertionError(f"rank {rank}: step {step}: {n} differs")
                if rank == INFER[0]:  # a sign of life per sync
                    print(f"sync {step + 1}/{args.steps}: {len(synced)} tensors exact, "
                          f"{times[-1] * 1e3:.0f} ms", flush=True)
        if rank == INFER[0]:
            nbytes = sum(t.numel() * t.element_size() for t in full.values())
            again = statistics.median(times[1:]) if len(times) > 1 else float("nan")
            print(f"{len(full)} tensors, {nbytes / 1e6:.1f} MB: FSDP on ranks {list(TRAIN)} -> "
                  f"TP on ranks {list(INFER)}, every shard equal to the full weights'; "
                  f"first sync {times[0] * 1e3:.0f} ms (plan + load + transfer), later syncs "
                  f"{again * 1e3:.0f} ms (median of {len(times) - 1})", flush=True)
        dist.barrier()
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
    args = ap.parse_args(argv)
    print(f"starting {WORLD} gloo processes (a few seconds) ...", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(rank_main, args=(os.path.join(tmp, "store"), args), nprocs=WORLD, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

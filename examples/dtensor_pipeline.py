"""Two DTensor pipeline stages on different meshes of 8 gloo processes, activations
moved between them by ``reshard.adapters.dtensor.redistribute``.

Stage 1 runs on ranks 0-3 as a (dp, tp) = (2, 2) mesh: ``h = gelu(x @ w1)`` with the
batch split over dp and ``w1`` column-parallel over tp, so ``h`` is
``[Shard(0), Shard(1)]``. Stage 2 runs on ranks 4-7 as a (tp,) = (4,) mesh: ``y = h @ w2``
with ``w2`` row-parallel, so it wants ``h`` as ``[Shard(1)]`` there. DTensor cannot move
a tensor to another mesh (``NotImplementedError("Cross device mesh comm not supported
yet!")``); reshard plans and runs that move as one collective of all 8 ranks. Each
stage computes with DTensor's own operators; every microbatch's output is checked
against the same computation in one process.

Run: ``python examples/dtensor_pipeline.py`` (CPU, torch with gloo). On a 2-core
machine most of its time is the 8 processes starting (each imports torch: they joined
after 15 s, 32 s in all, at a load average of 3.5-5.6; 30-70 s on a busier machine);
it prints when they have joined, each microbatch, and when it
shuts them down.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from reshard.adapters.dtensor import redistribute
from reshard.core.cliargs import add_version

WORLD = 8


def weights(d_in: int, hidden: int, d_out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's two weight matrices (the same in every process)."""
    g = torch.Generator().manual_seed(0)
    return (torch.randn(d_in, hidden, generator=g, dtype=torch.float64) / d_in ** 0.5,
            torch.randn(hidden, d_out, generator=g, dtype=torch.float64) / hidden ** 0.5)


def microbatch(k: int, batch: int, d_in: int) -> torch.Tensor:
    """Input of microbatch ``k``."""
    return torch.randn(batch, d_in, generator=torch.Generator().manual_seed(100 + k),
                       dtype=torch.float64)


def reference(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Both stages in one process."""
    return torch.nn.functional.gelu(x @ w1) @ w2


def placeholder(mesh: DeviceMesh, placements: list, shape: tuple[int, ...]) -> DTensor:
    """What a rank outside ``mesh`` holds of a DTensor on it: its metadata, no data."""
    return DTensor.from_local(torch.empty(0, dtype=torch.float64), mesh, placements,
                              run_check=False, shape=torch.Size(shape),
                              stride=(shape[1], 1))


def rank_main(rank: int, store_path: str, args: argparse.Namespace, t0: float) -> None:
    """One rank: both meshes, its stage's computation, every redistribute (``t0``:
    when the run started, for the progress lines)."""
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=WORLD)
    if rank == 0:
        print(f"all {WORLD} processes joined ({time.time() - t0:.0f} s); moving "
              f"{args.microbatches} microbatches ...", flush=True)
    try:
        torch.set_num_threads(1)
        stage1 = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("dp", "tp"))
        stage2 = DeviceMesh("cpu", torch.arange(4, 8), mesh_dim_names=("tp",))
        w1, w2 = weights(args.d_in, args.hidden, args.d_out)
        w1_d = distribute_tensor(w1, stage1, [Replicate(), Shard(1)], src_data_rank=None)
        w2_d = distribute_tensor(w2, stage2, [Shard(0)], src_data_rank=None)
        h_shape = (args.batch, args.hidden)
        worst = 0.0
        start = time.perf_counter()
        for k in range(args.microbatches):
            x = microbatch(k, args.batch, args.d_in)
            h: DTensor
            if rank < 4:  # stage 1, DTensor operators on its mesh
                x_d = distribute_tensor(x, stage1, [Shard(0), Replicate()], src_data_rank=None)
                h = torch.nn.functional.gelu(x_d @ w1_d)  # type: ignore[assignment]
            else:
                h = placeholder(stage1, [Shard(0), Shard(1)], h_shape)
            # every rank: the cross-mesh move (stage 1's layout -> stage 2's)
            h2 = redistribute(h, stage2, [Shard(1)], strategy=args.strategy)
            if rank >= 4:  # stage 2: row-parallel matmul, partial sums reduced by DTensor
                y = (h2 @ w2_d).full_tensor()  # type: ignore[attr-defined]
                err = float((y - reference(x, w1, w2)).abs().max())
                worst = max(worst, err)
                if err > 1e-9:
                    raise AssertionError(f"rank {rank}: microbatch {k} differs from the "
                                         f"one-process result by {err:g}")
                if rank == 4:  # a sign of life per microbatch
                    print(f"microbatch {k + 1}/{args.microbatches}: exact "
                          f"({time.perf_counter() - start:.1f} s)", flush=True)
        if rank == 4:
            print(f"{args.microbatches} microbatches through 2 stages on meshes (2, 2) and "
                  f"(4,): outputs equal the one-process result (max error {worst:.2e}); "
                  f"{time.perf_counter() - start:.2f} s", flush=True)
        dist.barrier()
        if rank == 0:
            print(f"shutting the {WORLD} processes down ...", flush=True)
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Run the pipeline on 8 processes; 0 when every output matched."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_version(ap)
    ap.add_argument("--batch", type=int, default=8, help="rows per microbatch (default 8)")
    ap.add_argument("--d-in", type=int, default=16, help="input features (default 16)")
    ap.add_argument("--hidden", type=int, default=30,
                    help="hidden units; uneven over 2 and 4 on purpose (default 30)")
    ap.add_argument("--d-out", type=int, default=8, help="output features (default 8)")
    ap.add_argument("--microbatches", type=int, default=4, help="default 4")
    ap.add_argument("--strategy", default="broadcast",
                    help="reshard strategy: broadcast, send_recv, allgather (default broadcast)")
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

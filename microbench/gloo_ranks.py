"""What every rank of a benchmark over torch.distributed gloo processes does: join the
group (and leave it, printing what went wrong first), time a collective step as its
slowest rank saw it, and hand the rows to the parent through rank 0's report file.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def gloo_group(rank: int, store: str, world: int) -> Iterator[None]:
    """This process as ``rank`` of a gloo group of ``world`` (rendezvous through the
    file ``store``) for the block; an error is printed here (a spawned process's
    traceback is otherwise lost) and raised; the group is destroyed after."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    try:
        yield
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


def slowest_rank(fn: Callable[[], Any]) -> tuple[float, Any]:
    """``fn()`` between barriers; the slowest rank's seconds (all ranks get it)."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    dist.barrier()
    slowest = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest), out


def report_rows(rank: int, path: str, rows: list[dict[str, Any]]) -> None:
    """Rank 0 writes ``rows`` to ``path`` (JSON) for the parent; every rank waits for
    it."""
    import torch.distributed as dist

    if rank == 0:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(rows, f)
    dist.barrier()


def spawn_ranks(rank_main: Callable[..., None], world: int, *args: Any) -> list[dict[str, Any]]:
    """Run ``rank_main(rank, store, report, *args)`` in ``world`` spawned processes
    (one thread each for BLAS: ``OMP_NUM_THREADS=1`` unless set) and return the rows
    rank 0 reported (:func:`report_rows`)."""
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "rows.json")
        mp.spawn(rank_main, args=(os.path.join(tmp, "store"), report, *args), nprocs=world,
                 join=True)
        with open(report, encoding="utf-8") as f:
            rows: list[dict[str, Any]] = json.load(f)
    return rows


__all__ = ["gloo_group", "report_rows", "slowest_rank", "spawn_ranks"]

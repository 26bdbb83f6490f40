"""A rank that fails before a redistribute (and stays alive, stuck elsewhere): its
peers fail within the Redistributor's timeout naming it (issue 44 item 6), where they
waited in the default group's collective until it exited (its timeout is 30 min)."""

from __future__ import annotations

import os
import pathlib
import time

import pytest

pytestmark = pytest.mark.cpu

torch = pytest.importorskip("torch")


def _rank(rank: int, folder: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from reshard.adapters.dtensor import Redistributor, redistribute

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=4)
    t0 = time.monotonic()
    try:
        a = DeviceMesh("cpu", torch.arange(2))
        b = DeviceMesh("cpu", torch.arange(2, 4))
        x = distribute_tensor(torch.arange(16.0).reshape(4, 4), a, [Shard(0)],
                              src_data_rank=None)
        if rank == 3:
            raise RuntimeError("rank 3 fails before the collective")
        redistribute(x, b, [Shard(1)], redistributor=Redistributor(timeout=4))
        text = "done"
    except Exception as e:  # noqa: BLE001 - written for the test
        text = f"{type(e).__name__}: {e}"
    pathlib.Path(folder, f"{rank}.txt").write_text(f"{time.monotonic() - t0:.1f}\n{text}")
    if rank == 3:
        time.sleep(25)  # alive, stuck elsewhere: its peers must not wait for it
    os._exit(0)


@pytest.mark.timeout(120)
def test_peers_of_a_rank_that_failed_before_the_call_fail_in_time_naming_it(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(str(tmp_path),), nprocs=4, join=True)
    for rank in range(3):
        took, text = (tmp_path / f"{rank}.txt").read_text().split("\n", 1)
        assert text.startswith("ExecutionError") and "ranks [3] did not join" in text, text
        assert float(took) < 15, took  # the Redistributor's 4 s, not rank 3's 25 s

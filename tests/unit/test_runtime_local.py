"""The Runtime's driver-side rules on the reference (local) backend: handles, user
errors that leave it usable, threads, the plan cache."""

from __future__ import annotations

import numpy as np
import pytest

from reshard import DeviceMesh, Layout, ReshardError, ShapeError
from reshard.runtime import DArray, Runtime

from ..common import check_shards, in_threads

A = Layout(DeviceMesh((2,), [0, 1]), "S0R")
B = Layout(DeviceMesh((3,), [2, 3, 4]), "RS0")


def test_nbytes_does_not_overflow():
    x = DArray("k", (2**32, 2**32), "float64", A)
    assert x.nbytes == 2**64 * 8


def test_freed_and_forged_handles_are_user_errors(local_runtime):
    rt = local_runtime
    value = np.arange(30.0).reshape(6, 5)
    x = rt.put(value, A)
    rt.free(x)
    with pytest.raises(ReshardError, match="was freed"):
        rt.get(x)
    with pytest.raises(ReshardError, match="was freed"):
        rt.free(x)
    y = rt.put(value, A)
    with pytest.raises(ReshardError, match="does not match"):
        rt.get(DArray(y.key, (7, 5), y.dtype, A))
    with pytest.raises(ReshardError, match="same array twice"):
        rt.free(y, y)
    with pytest.raises(ReshardError, match="DArray"):
        rt.shards("a0")  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match="equal-length"):
        rt.put([[1, 2], [3]], A)
    check_shards(rt, rt.reshard(y, B), value)  # still usable


def test_max_plans_must_be_positive():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ReshardError, match="max_plans"):
            Runtime("local", max_plans=bad)


def test_plan_cache_is_bounded_and_lru(local_runtime):
    rt = Runtime("local", max_plans=3)
    with rt:
        for n in range(10):
            x = rt.put(np.ones((4 + n, 3)), A)
            rt.free(x, rt.reshard(x, B))
            assert rt.loaded_plans == min(n + 1, 3)
        loaded = {len(w.plans) for w in rt.group.workers.values()}
        assert loaded <= {0, 1, 2, 3}, loaded


def test_threads_on_the_local_backend():
    with Runtime("local") as rt:
        def work(k: int) -> None:
            for i in range(25):
                value = np.full((6 + k, 4 + i % 3), k * 100 + i, dtype=np.int64)
                x = rt.put(value, A)
                y = rt.reshard(x, B, ("broadcast", "send_recv", "allgather")[i % 3])
                check_shards(rt, y, value)
                rt.free(x, y)

        errors = in_threads(work, 8, 120)
    assert not errors, errors[:3]


def test_a_worker_that_failed_stops_communicating():
    """Calls queued behind a failed plan must not run: their messages would reach
    peers still inside the failed plan."""
    from reshard import ExecutionError
    from reshard.comm.backends.local import LocalBackend, LocalFabric
    from reshard.comm.worker import DeviceWorker

    w = DeviceWorker(0, LocalBackend(0, LocalFabric(1.0)))
    with pytest.raises(ReshardError, match="not loaded"):
        w.execute(7, [], [])
    assert w.failed is not None
    with pytest.raises(ExecutionError, match="failed here earlier"):
        w.load_plan(1, "{}")
    with pytest.raises(ExecutionError, match="failed here earlier"):
        w.invoke("x", "run")
    w.put("k", np.ones(3))  # local data calls still answer
    assert w.get("k").tolist() == [1.0, 1.0, 1.0]

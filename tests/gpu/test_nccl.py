"""nccl with the process launcher: the CPU tier's checks on GPUs.

Four ranks; with fewer GPUs they share GPU 0 (distinct ``NCCL_HOSTID`` each), which
checks correctness, not speed. Skipped without cupy or a GPU.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from hypothesis import given

from reshard import Cluster, DeviceMesh, ExecutionError, Layout, ShapeError
from reshard.runtime import Runtime

from ..cpu._helpers import (
    check_paper_case,
    check_random_problem,
    paper_cases,
    problem_settings,
    problems,
    wait_gone,
)
from .conftest import nccl_env

pytestmark = pytest.mark.gpu

CLUSTER = Cluster.regular(4, 1)  # four ranks, one per "host"
CASES = tuple(c.narrowed(1) for c in paper_cases())


@pytest.fixture(scope="module")
def rt(gpus):
    with Runtime("nccl", CLUSTER, "process", timeout=60,
                 env=nccl_env(len(CLUSTER.devices), gpus)) as runtime:
        yield runtime


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES, ids=[f"case{c.name}" for c in CASES])
def test_paper_case(rt, case):
    check_paper_case(rt, case, CLUSTER)


@pytest.mark.timeout(600)
@problem_settings(max_examples=15)
@given(problem=problems(devices=CLUSTER.devices))
def test_random_layouts(rt, problem):
    check_random_problem(rt, problem)


@pytest.mark.timeout(120)
def test_bad_input_refused(rt):
    src = Layout(DeviceMesh((2,), [0, 1]), "S0R")
    good = np.zeros((4, 3), np.float32)
    with pytest.raises(ShapeError):
        rt.put_shards({0: good[:2], 1: good[:1]}, src, good.shape, good.dtype)
    x = rt.put(good, src)
    plan = rt.plan(x, Layout(DeviceMesh((2,), [2, 3]), "RS0"))
    with pytest.raises(ShapeError):
        rt.execute(plan, [rt.put(good.astype(np.float64), src)])


@pytest.mark.timeout(300)
def test_worker_killed_mid_plan(gpus):
    timeout = 30.0
    src = Layout(DeviceMesh((2,), [0, 1]), "S0R")
    dst = Layout(DeviceMesh((2,), [2, 3]), "RS0")
    rt = Runtime("nccl", CLUSTER, "process", timeout=timeout,
                 env=nccl_env(len(CLUSTER.devices), gpus))
    pids = dict(rt.group.pids)
    box: dict = {}
    try:
        value = np.ones((1024, 1024), np.float32)
        x = rt.put(value, src)
        plan = rt.plan(x, dst, "broadcast")
        rt.load(plan)
        os.kill(pids[3], signal.SIGSTOP)

        def run():
            t0 = time.monotonic()
            try:
                rt.execute(plan, [x])
            except BaseException as e:  # noqa: BLE001
                box["error"] = e
            box["seconds"] = time.monotonic() - t0

        th = threading.Thread(target=run, daemon=True)
        th.start()
        time.sleep(2.0)
        assert th.is_alive()
        os.kill(pids[3], signal.SIGKILL)
        th.join(timeout + 30)
        assert not th.is_alive(), "reshard hangs"
    finally:
        rt.close()
    err = box.get("error")
    assert isinstance(err, ExecutionError), box
    assert "device 3" in str(err), str(err)
    assert box["seconds"] < timeout + 10
    assert wait_gone(pids.values()) == []

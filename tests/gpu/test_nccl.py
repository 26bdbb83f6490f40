"""nccl with the process launcher: the CPU tier's checks on GPUs.

Four ranks; with fewer GPUs they share GPU 0 (distinct ``NCCL_HOSTID`` each), which
checks correctness, not speed. The paper's cases in int32, float32 and bfloat16 (also
at a size whose strided boxes move as pitched copies), float32 and bfloat16 partial
sums, casts on the wire to bfloat16 and float8 (tensor and 128 x 128 block scales),
every result byte for byte against the numpy reference. Skipped without cupy or a GPU.
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
from reshard.dtypes import Cast, ScaleMode
from reshard.runtime import Runtime

from ..cpu._helpers import (
    check_cast,
    check_paper_case,
    check_partial_sum,
    check_random_problem,
    check_strategies,
    paper_cases,
    problem_settings,
    problems,
    sample,
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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=[f"case{c.name}" for c in CASES])
def test_paper_case_floats(rt, case, dtype):
    """The paper's cases in float32 and bfloat16 (bf16 moves as its bits), at a size
    whose strided boxes have rows of 512+ bytes (pitched copies, comm.pitched)."""
    shape = (48, 32, 130) if case.name == "6" else (32, 32, 128)
    src, dst = case.layouts(CLUSTER)
    value = sample(np.random.default_rng(int(case.name)), shape, dtype)
    x = rt.put(value, src)
    check_strategies(rt, x, dst, value)
    rt.free(x)


PARTIALS = [  # (shape, source, destination)
    ((300_000,), Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "R+P01"),
     Layout(DeviceMesh((2,), [2, 3]), "R")),
    ((513, 129), Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "S0R+P1"),
     Layout(DeviceMesh((4,), [3, 2, 1, 0]), "RS0")),
    ((64, 300), Layout(DeviceMesh((2,), [0, 1]), "RR+P0"),
     Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "S1S0")),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", PARTIALS, ids=[f"{c[1].spec}->{c[2].spec}" for c in PARTIALS])
def test_partial_sums(rt, case, dtype):
    """Partial sums reduced by NCCL (bf16: in float32, from and back to its bits on the
    GPU), rounded once: the reference's bits, for every strategy; the caller's addends
    untouched."""
    shape, src, dst = case
    check_partial_sum(rt, shape, src, dst, dtype)


H01 = DeviceMesh((2, 2), [0, 1, 2, 3])
CASTS = [
    ("float32", Cast("bfloat16"), (1000, 300), Layout(H01, "S0S1"),
     Layout(DeviceMesh((2,), [2, 3]), "RS0")),
    ("bfloat16", Cast("float8_e4m3fn"), (257, 3, 100), Layout(DeviceMesh((2,), [0, 1]), "RS0R"),
     Layout(DeviceMesh((2,), [2, 3]), "S0RR")),
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.TENSOR), (300, 517), Layout(H01, "S1S0"),
     Layout(DeviceMesh((2,), [3, 1]), "RR")),
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128), (300, 517), Layout(H01, "S0S1"),
     Layout(DeviceMesh((2, 2), [3, 2, 1, 0]), "S1S0")),  # shards straddle blocks
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128), (512, 1024), Layout(H01, "S0S1"),
     Layout(DeviceMesh((1, 2), [2, 3]), "RS1")),  # whole blocks: each source its own scales
    ("float32", Cast("float8_e5m2", ScaleMode.BLOCK128), (2, 260, 140),
     Layout(DeviceMesh((2,), [0, 1]), "RRR"), Layout(DeviceMesh((2,), [2, 3]), "RS0R")),
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128_UE8M0), (300, 517),
     Layout(H01, "S0S1"), Layout(DeviceMesh((2, 2), [3, 2, 1, 0]), "S1S0")),
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.MX32), (300, 517), Layout(H01, "S0S1"),
     Layout(DeviceMesh((2,), [2, 3]), "RS0")),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASTS,
                         ids=[f"{c[0]}->{c[1]}-{c[3].spec}->{c[4].spec}" for c in CASTS])
def test_cast_on_the_wire(rt, case):
    """Converted on the GPU as it is packed (bf16 / fp8 as bits, reshard.bits; block
    amax reduced with NCCL's MAX): values and scales equal the numpy reference bit for
    bit, for every strategy."""
    check_cast(rt, *case)


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

"""The nccl backend's logic on CPU, with a fake ``cupy`` (tests/cpu/fake_cupy) whose
NCCL runs on gloo: communicators made once per member set in plan order through the
rendezvous, ranks and counts, reduce dtypes, the worker loop with ``xp = cupy``.

Not a substitute for tests/gpu: the fake follows cupy's documented signatures but
cannot check them. Workers start with ``spawn`` so that they see the fake on their
``sys.path``; the driver never imports it.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given

from reshard import Cluster, DeviceMesh, Layout
from reshard.dtypes import Cast, ScaleMode

from ._helpers import (
    STRATEGIES,
    addends,
    check_cast,
    check_paper_case,
    check_partial_sum,
    check_random_problem,
    check_shards,
    fake_nccl_runtime,
    paper_cases,
    problem_settings,
    problems,
    sample,
)

pytestmark = pytest.mark.cpu

CLUSTER = Cluster.regular(4, 1)


@pytest.fixture(scope="module")
def rt():
    with fake_nccl_runtime(CLUSTER) as runtime:
        yield runtime
        assert "cupy" not in sys.modules, "the driver imported the fake cupy"


@pytest.mark.timeout(180)
def test_paper_cases_on_fake_nccl(rt):
    assert rt.capabilities.groups_need_world is False  # communicators: members only
    for case in paper_cases():
        check_paper_case(rt, case.narrowed(1), CLUSTER)


@pytest.mark.timeout(180)
@problem_settings(max_examples=15)
@given(problem=problems(devices=CLUSTER.devices))
def test_random_layouts_on_fake_nccl(rt, problem):
    check_random_problem(rt, problem)


@pytest.mark.timeout(180)
def test_narrow_dtypes_on_fake_nccl(rt):
    """bfloat16 and float8 move as their bits (cupy has neither type); float16 and
    bfloat16 partial sums accumulate in float32 and round once (bf16 as its bits,
    reshard.bits); casts to bfloat16 and float8 (unscaled, tensor, 128 x 128 block,
    UE8M0 block and MX scales, E8M0 held as its bits) deliver the numpy reference bit for bit, with its scales."""
    rng = np.random.default_rng(4)
    src = Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "S0S1")
    dst = Layout(DeviceMesh((2,), [1, 3]), "RS0")
    for dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        value = sample(rng, (9, 14), dtype)
        y = rt.reshard(rt.put(value, src), dst)
        check_shards(rt, y, value)  # shards come back in the array's own dtype
    half = Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "S0R+P1")
    for dtype in ("float16", "bfloat16"):
        check_partial_sum(rt, (6, 260), half, dst, dtype)
    for src_dtype, cast in (("float32", Cast("bfloat16")),
                            ("bfloat16", Cast("float8_e4m3fn")),
                            ("float32", Cast("float8_e4m3fn", ScaleMode.TENSOR)),
                            ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128)),
                            ("bfloat16", Cast("float8_e5m2", ScaleMode.BLOCK128)),
                            ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128_UE8M0)),
                            ("bfloat16", Cast("float8_e4m3fn", ScaleMode.MX32))):
        check_cast(rt, src_dtype, cast, (300, 260), src, dst)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["int16", "uint16", "complex64", "float16", "uint64"])
def test_reduce_dtypes_on_fake_nccl(rt, dtype):
    """Partial sums in dtypes NCCL lacks (widened) or has only as pairs (complex)."""
    rng = np.random.default_rng(1)
    value = (sample(rng, (6, 4), dtype) * 700).astype(dtype)  # int16 sums wrap
    src = Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "S0R+P1")
    dst = Layout(DeviceMesh((2,), [1, 3]), "RS0")
    x = rt.put_shards(addends(rng, value, src), src, value.shape, dtype)
    for strategy in STRATEGIES:
        check_shards(rt, rt.reshard(x, dst, strategy), value)


@pytest.mark.timeout(120)
def test_fused_sums_run_as_their_parts_on_fake_nccl(rt):
    """NCCL cannot sum on the way down a chain (``fuses_sums`` false): a plan's
    broadcasts of partial sums run as a reduction, then a broadcast of the sum, each
    with its own communicator. Every destination shard exact."""
    from reshard import ReshardPlan
    from reshard.planner.cells.fuse import fuse_reductions
    from reshard.planner.plan import make_tensor_spec, plan_tasks
    from reshard.planner.values.strategy import Strategy

    assert not rt.capabilities.fuses_sums
    src = Layout(DeviceMesh((1, 2), [0, 1]), "RR+P1")
    dst = Layout(DeviceMesh((2,), [2, 3]), "S0R")
    shape, dtype = (10, 7), "int32"
    tensors = (make_tensor_spec(shape, dtype, src, dst, CLUSTER),)
    tasks = fuse_reductions(plan_tasks(tensors, CLUSTER, Strategy.BROADCAST, fan_out=False,
                                       fuse=True)[0])
    plan = ReshardPlan(tensors, tasks, Strategy.BROADCAST, CLUSTER)
    assert all(t.addends for t in plan.tasks)
    rng = np.random.default_rng(2)
    value = sample(rng, shape, dtype)
    x = rt.put_shards(addends(rng, value, src), src, value.shape, dtype)
    check_shards(rt, rt.execute(plan, [x])[0], value)

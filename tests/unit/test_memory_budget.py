"""A byte budget on staging memory: plans made within it move every byte exactly, no
device stages more than the budget (as the executor allocates it), and a budget too
small is refused naming the smallest that works."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.comm.backends.local import LocalBackend, LocalFabric
from reshard.comm.engine.steps import program_steps
from reshard.comm.program import WorkerProgram
from reshard.planner.ir import ReshardPlan
from reshard.planner.schedule.staging import (
    fit_budget,
    smallest_budget,
    split_box,
    staging_by_device,
)

from ..common import STRATEGIES, check_shards, put_value, sample
from .test_planner_properties import planning_problems

CLUSTER = Cluster.regular(2, 4)
SRC = Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "S0S1")
DST = Layout(DeviceMesh((4,), [4, 5, 6, 7]), "RS0")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planning_problems(), st.sampled_from(STRATEGIES), st.integers(0, 2 ** 32 - 1),
       st.floats(0.0, 1.0))
def test_plans_within_a_budget_are_exact_and_stay_within_it(problem, strategy, seed, frac):
    shape, dtype, src, dst, cluster = problem
    free = reshard.plan(shape, dtype, src, dst, cluster=cluster, strategy=strategy)
    least = smallest_budget(free.tasks, free.tensors)
    most = max(staging_by_device(free.tasks, free.tensors).values(), default=least)
    budget = int(least + frac * max(0, most - least))
    rng = np.random.default_rng(seed)
    value = sample(rng, shape, dtype.name)
    with reshard.Runtime(backend="local", cluster=cluster, memory_budget=budget) as rt:
        x = put_value(rt, value, src, rng)
        p = rt.plan(x, dst, strategy)  # verified by the Runtime
        staged = staging_by_device(p.tasks, p.tensors)
        assert max(staged.values(), default=0) <= budget
        for d in p.devices:  # what the executor allocates is what the planner counted
            _, need = program_steps(WorkerProgram.of(p, d), fuses=False)
            assert need <= staged.get(d, 0)
        y = rt.execute(p, [x])[0]
        check_shards(rt, y, value)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planning_problems(), st.sampled_from(STRATEGIES), st.integers(0, 2 ** 32 - 1),
       st.floats(0.0, 1.0), st.booleans())
def test_even_and_first_fit_buckets_are_each_exact_and_within_the_budget(problem, strategy,
                                                                          seed, frac, even):
    shape, dtype, src, dst, cluster = problem
    free = reshard.plan(shape, dtype, src, dst, cluster=cluster, strategy=strategy)
    least = smallest_budget(free.tasks, free.tensors)
    most = max(staging_by_device(free.tasks, free.tensors).values(), default=least)
    budget = int(least + frac * max(0, most - least))
    p = ReshardPlan(free.tensors, fit_budget(free.tasks, free.tensors, budget, even=even),
                    free.strategy, free.cluster)
    p.verify()
    assert max(staging_by_device(p.tasks, p.tensors).values(), default=0) <= budget
    rng = np.random.default_rng(seed)
    value = sample(rng, shape, dtype.name)
    with reshard.Runtime(backend="local", cluster=cluster) as rt:
        x = put_value(rt, value, src, rng)
        check_shards(rt, rt.execute(p, [x])[0], value)


def test_the_planner_keeps_the_faster_bucketing():
    """Experts on few devices (MoE-like: one device's step stages 8x another's): even
    buckets keep every bucket's share of the busy devices' bytes; the model picks."""
    cluster = Cluster.preset("dgx-h100", 2)
    few = Layout(DeviceMesh((2,), [0, 1]), "S0RR")
    many = Layout(DeviceMesh((8,), range(8, 16)), "RS0R")
    dense = Layout(DeviceMesh((8,), range(8)), "S0R")
    wide = Layout(DeviceMesh((8,), range(8, 16)), "RS0")
    reqs = [((16, 2048, 1024), "bfloat16", few, many), ((4096, 4096), "bfloat16", dense, wide)]
    free = reshard.plan_many(reqs, cluster=cluster)
    budget = max(staging_by_device(free.tasks, free.tensors).values()) // 6
    est = {}
    for even in (False, True):
        tasks = fit_budget(free.tasks, free.tensors, budget, even=even)
        est[even] = ReshardPlan(free.tensors, tasks, free.strategy, cluster).estimate()
    chosen = reshard.plan_many(reqs, cluster=cluster, memory_budget=budget)
    assert chosen.estimate() == min(est.values())
    assert est[True] < est[False]  # here even buckets win


def test_a_big_transfer_runs_in_buckets_and_pieces():
    value = np.arange(512 * 512, dtype=np.float32).reshape(512, 512)
    free = reshard.plan(value.shape, "float32", SRC, DST, cluster=CLUSTER)
    # each device sends or receives two 256 x 128 boxes in one step
    assert max(staging_by_device(free.tasks, free.tensors).values()) == 2 * 256 * 128 * 4
    budget = 64 << 10
    with reshard.Runtime("local", CLUSTER, memory_budget=budget) as rt:
        x = rt.put(value, SRC)
        p = rt.plan(x, DST)
        assert len(p.tasks) > len(free.tasks)  # split into pieces
        assert len({t.step for t in p.tasks}) > len({t.step for t in free.tasks})
        assert max(staging_by_device(p.tasks, p.tensors).values()) <= budget
        y = rt.execute(p, [x])[0]
        assert np.array_equal(rt.get(y), value)
        with pytest.raises(reshard.ReshardError, match="over the Runtime's memory_budget"):
            rt.execute(free, [x])  # a plan made without the budget is refused


def test_a_budget_too_small_names_the_smallest_that_works():
    with pytest.raises(reshard.ReshardError, match=r"smallest budget that works for this "
                                                   r"plan is (\d+) bytes") as e:
        reshard.plan((512, 512), "float32", SRC, DST, cluster=CLUSTER, memory_budget=10)
    smallest = int(e.value.args[0].rsplit("is ", 1)[1].split()[0])
    p = reshard.plan((8, 8), "float32", SRC, DST, cluster=CLUSTER, memory_budget=smallest)
    assert max(staging_by_device(p.tasks, p.tensors).values()) <= smallest
    for bad in (0, -5, 1.5, True):
        with pytest.raises(reshard.ReshardError, match="memory_budget must be"):
            reshard.plan((8, 8), "float32", SRC, DST, cluster=CLUSTER, memory_budget=bad)


@given(st.lists(st.integers(1, 9), min_size=1, max_size=3), st.integers(1, 100))
def test_split_box_tiles_the_box_within_the_limit(extents, limit):
    box = tuple((2, 2 + n) for n in extents)
    parts = split_box(box, limit)
    cells = [c for p in parts for c in np.ndindex(*[b - a for a, b in p])
             for c in [tuple(a + i for (a, _), i in zip(p, c))]]
    assert sorted(cells) == sorted(tuple(2 + i for i in c) for c in np.ndindex(*extents))
    assert all(np.prod([b - a for a, b in p]) <= limit for p in parts)


def test_executor_refuses_a_program_over_its_budget():
    from reshard.comm.executor import Executor

    plan = reshard.plan((512, 512), "float32", SRC, DST, cluster=CLUSTER)
    ex = Executor(LocalBackend(4, LocalFabric()), memory_budget=1 << 16)
    with pytest.raises(reshard.ReshardError, match="over this executor's memory_budget"):
        ex.load(plan)
    ok = reshard.plan((512, 512), "float32", SRC, DST, cluster=CLUSTER, memory_budget=1 << 16)
    assert ex.load(ok).scratch.nbytes <= 1 << 16

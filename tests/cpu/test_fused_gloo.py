"""Partial sums reduced on the way to their receivers, on gloo worker processes
(planner/cells/fuse.py): each piece summed down the addends' chain (or star, or binary tree)
into the root and passed on at once (gloo's chain of a sum), also reshaped into trees. Every destination shard
exact, the callers' source shards untouched, for several pieces per chain (boxes over
gloo's 256 KiB piece), dtypes that wrap (int16) or round (float32, summed in order by
every backend alike; float16 and bfloat16 accumulate in float32 and are never fused),
addends on several hosts, and a plan run twice."""

from __future__ import annotations

import numpy as np
import pytest

from reshard import DeviceMesh, Layout, ReshardPlan
from reshard.comm.backends.gloo import CHAIN_PIECE
from reshard.planner.cells.fuse import SumShape, fuse_reductions
from reshard.planner.cells.trees import INTRA, treeify
from reshard.planner.plan import make_tensor_spec, plan_tasks
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import TaskKind

from ._helpers import WORLD, addends, check_shards, sample

pytestmark = pytest.mark.cpu

CASES = [  # (shape, dtype, source, destination)
    # two addends on one host -> replicated on two hosts; several pieces per chain
    ((3 * CHAIN_PIECE // 8 + 5, 2), "int32", Layout(DeviceMesh((1, 2), [0, 1]), "RR+P1"),
     Layout(DeviceMesh((2, 2), [2, 3, 4, 5]), "RR")),
    # four addends over two hosts (the chain crosses a host) -> rows split on two hosts
    ((CHAIN_PIECE // 4 + 3, 4), "float32", Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "RR+P01"),
     Layout(DeviceMesh((2, 2), [4, 5, 6, 7]), "S0R")),
    # sharded and partial: several chains of a sum in one step (relays polled together)
    ((10, 3), "int16", Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "S0R+P1"),
     Layout(DeviceMesh((2, 2), [4, 5, 6, 7]), "RS0")),
]


def fused_plan(shape, dtype, src, dst, tree: tuple[str, str] | None = None,
               sums: SumShape = SumShape.CHAIN) -> ReshardPlan:
    tensors = (make_tensor_spec(shape, dtype, src, dst, WORLD),)
    tasks = fuse_reductions(plan_tasks(tensors, WORLD, Strategy.BROADCAST, fan_out=False,
                                       fuse=True)[0], shape=sums)
    if tree is not None:
        tasks = treeify(tasks, WORLD.host_of, tree[1], tree[0])
    plan = ReshardPlan(tensors, tasks, Strategy.BROADCAST, WORLD)
    assert all(t.kind is not TaskKind.REDUCE for t in plan.tasks), plan.tasks
    assert any(t.addends for t in plan.tasks)
    return plan


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sums", list(SumShape), ids=[s.value for s in SumShape])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[2].spec}->{c[3].spec}" for c in CASES])
def test_fused_plan_exact_on_gloo(rt, case, sums):
    shape, dtype, src, dst = case
    plan = fused_plan(shape, dtype, src, dst, sums=sums)
    fused = [t for t in plan.tasks if t.addends]
    if sums is SumShape.STAR:  # every addend straight to the root
        assert all(t.addend_parents == (t.root,) * len(t.addends) for t in fused)
    if sums is SumShape.BINARY and str(src.spec) == "RR+P01":  # the root sums two, an addend one
        assert all(len(t.addends) == 3 and t.addend_parents[:2] == (t.root,) * 2
                   and t.addend_parents[2] == t.addends[0] for t in fused)
    rng = np.random.default_rng(sum(shape))
    for _ in range(2):  # a loaded plan runs again from fresh addends
        value = sample(rng, shape, dtype)
        given = addends(rng, value, src)
        x = rt.put_shards(given, src, value.shape, value.dtype)
        check_shards(rt, rt.execute(plan, [x])[0], value)
        kept = rt.shards(x)
        assert all(kept[d].tobytes() == given[d].tobytes() for d in given), \
            "a source shard changed"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tree", [("double", INTRA[1]), ("star", INTRA[0])])
def test_fused_trees_exact_on_gloo(rt, tree):
    shape, dtype = (CHAIN_PIECE // 4 + 9, 2), "int64"
    src = Layout(DeviceMesh((1, 2), [0, 1]), "RR+P1")
    dst = Layout(DeviceMesh((3, 2), [2, 3, 4, 5, 6, 7]), "RR")
    plan = fused_plan(shape, dtype, src, dst, tree)
    assert any(t.parents and t.addends for t in plan.tasks)
    rng = np.random.default_rng(7)
    value = sample(rng, shape, dtype)
    x = rt.put_shards(addends(rng, value, src), src, value.shape, value.dtype)
    check_shards(rt, rt.execute(plan, [x])[0], value)


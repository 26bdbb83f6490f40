"""Broadcast trees on gloo worker processes: chains over three or more hosts reshaped
into two half-box binary trees, or fed host by host from the root's host
(planner/cells/trees.py), pipelined in pieces by gloo's tree broadcast. Every destination shard exact, with several pieces per half (boxes
over gloo's 256 KiB piece), several trees in one step (relays polled together) and
one (a lone relay), for both ways of passing on inside a host."""

from __future__ import annotations

import numpy as np
import pytest

from reshard import DeviceMesh, Layout, ReshardPlan
from reshard.comm.backends.gloo import CHAIN_PIECE
from reshard.planner.cells.trees import INTRA, treeify
from reshard.planner.plan import make_tensor_spec, plan_tasks
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import TaskKind

from ._helpers import WORLD, check_shards, sample

pytestmark = pytest.mark.cpu

HOSTS_1_TO_3 = DeviceMesh((3, 2), [2, 3, 4, 5, 6, 7])
CASES = [  # (shape, dtype, source, destination)
    # one device -> six on three other hosts: one tree pair, halves of 3 pieces each
    ((3 * CHAIN_PIECE // 4 * 2 + 5,), "float32", Layout(DeviceMesh((1,), [0]), "R"),
     Layout(HOSTS_1_TO_3, "R")),
    # two shards on host 0 -> replicated on hosts 1-3: two tree pairs in one step
    ((2 * CHAIN_PIECE // 8 + 3, 9), "int64", Layout(DeviceMesh((1, 2), [0, 1]), "RS0"),
     Layout(HOSTS_1_TO_3, "RR")),
    # a small odd box: one piece per half, the second half one element shorter
    ((7, 3), "int16", Layout(DeviceMesh((1,), [1]), "RR"), Layout(HOSTS_1_TO_3, "S1R")),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("form", ["double", "star"])  # hosts of two: no "chain" form
@pytest.mark.parametrize("intra", INTRA)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[2].spec}->{c[3].spec}" for c in CASES])
def test_tree_plan_exact_on_gloo(rt, case, intra, form):
    shape, dtype, src, dst = case
    tensors = (make_tensor_spec(shape, dtype, src, dst, WORLD),)
    tasks, _ = plan_tasks(tensors, WORLD, Strategy.BROADCAST, fan_out=False)
    plan = ReshardPlan(tensors, treeify(tasks, WORLD.host_of, intra, form),
                       Strategy.BROADCAST, WORLD)
    assert any(t.parents for t in plan.tasks), "no chain became a tree"
    assert all(t.kind is not TaskKind.BROADCAST or t.parents for t in plan.tasks)
    rng = np.random.default_rng(len(plan.tasks))
    value = sample(rng, shape, dtype)
    x = rt.put(value, src)
    y = rt.execute(plan, [x])[0]
    check_shards(rt, y, value)
    rt.free(x, y)

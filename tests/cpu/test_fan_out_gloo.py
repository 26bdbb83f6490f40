"""Fanned-out broadcasts on gloo worker processes: pipelined partial-sum pieces cross
to one device of their last host, which relays each piece from its destination shard
to the rest of the host one step later (sends and broadcasts with ``source=dst``).
Every destination shard exact, for random pipelined partial sums."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from reshard import DeviceMesh, Layout, ReshardPlan
from reshard.planner.plan import make_tensor_spec, plan_tasks
from reshard.planner.values.strategy import Strategy

from ._helpers import WORLD, addends, check_shards, sample

pytestmark = pytest.mark.cpu

CASES = [  # (shape, dtype, source, destination, pieces)
    ((12, 5), "int32", Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "RR+P1"),
     Layout(DeviceMesh((2, 2), [4, 5, 6, 7]), "RR"), 3),
    ((16, 3), "float64", Layout(DeviceMesh((1, 2), [0, 1]), "S0R+P1"),
     Layout(DeviceMesh((2, 2), [2, 3, 4, 5]), "RS0"), 4),
    ((9, 4), "int16", Layout(DeviceMesh((2, 2), [0, 2, 4, 6]), "RS0+P1"),
     Layout(DeviceMesh((3, 2), [1, 0, 3, 2, 7, 6]), "S0R"), 2),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[2].spec}->{c[3].spec}" for c in CASES])
def test_fanned_out_plan_exact_on_gloo(rt, case):
    shape, dtype, src, dst, pieces = case
    with mock.patch("reshard.planner.cells.reduce.reduce_pieces", lambda *_: pieces):
        tensors = (make_tensor_spec(shape, dtype, src, dst, WORLD),)
        tasks, _ = plan_tasks(tensors, WORLD, Strategy.BROADCAST, fan_out=True)
    plan = ReshardPlan(tensors, tasks, Strategy.BROADCAST, WORLD)
    assert any(t.source.value == "dst" for t in plan.tasks), "no chain fanned out"
    rng = np.random.default_rng(len(tasks))
    value = sample(rng, shape, dtype)
    x = rt.put_shards(addends(rng, value, src), src, value.shape, value.dtype)
    check_shards(rt, rt.execute(plan, [x])[0], value)

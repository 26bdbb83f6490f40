"""A plan priced from its columns (issue 62, round six: its other tasks' routes and
devices laid into the arrays at once): the seconds of plans with many broadcasts and
reductions beside their sends are the seconds of simulating every task, bit for bit."""

from __future__ import annotations

import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.builds import Builds
from reshard.planner.costing.columns import estimate_columns
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import make_tensor_spec
from reshard.planner.values.strategy import Strategy


@pytest.mark.parametrize("src,dst", [("RR+P01", "RS0"), ("S0R+P1", "RS0"), ("S10R", "RR"),
                                     ("RS1+P0", "S0S1")])
def test_columns_price_other_tasks_as_the_whole_plan(src, dst):
    cluster = Cluster.preset("dgx-h100", 8)
    a = Layout(DeviceMesh((4, 8), range(32)), src)
    b = Layout(DeviceMesh((4, 8), range(32, 64)), dst)
    tensors = (make_tensor_spec((2048, 512), "bfloat16", a, b, cluster),)
    ordered, _ = Builds().columns(tensors, cluster, Strategy.BROADCAST, False)
    tasks = ordered.tasks()
    assert len(ordered.objects) > 1  # tasks besides sends
    want = ReshardPlan(tensors, tasks, Strategy.BROADCAST, cluster).estimate()
    assert estimate_columns(ordered, tensors, cluster) == want

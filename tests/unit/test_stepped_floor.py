"""cost.stepped_floor: a bound on the cost model's prediction from a plan's steps alone
(the planner skips simulating first-fit buckets whose floor is above the even ones'
prediction)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.planner import plan as planner
from reshard.planner.costing import cost
from reshard.planner.ir import ReshardPlan

from ..common import problems

CLUSTERS = {
    "dgx-h100": Cluster.preset("dgx-h100", 4, 2),  # a NIC per device
    "paper": Cluster.regular(4, 2),  # devices sharing a host's NIC
    "shared": Cluster.regular(2, 4, shared_bandwidth=5e9),  # a shared bandwidth
}


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(problem=problems(Cluster.regular(4, 2).devices, max_ndim=2, max_size=8),
       strategy=st.sampled_from(["broadcast", "send_recv", "allgather"]),
       cluster=st.sampled_from(sorted(CLUSTERS)), data=st.data())
def test_the_floor_is_never_above_the_simulation(problem, strategy, cluster, data):
    """Any steps (the plan's own, or drawn at random per task): the floor is at most
    the model's prediction."""
    shape, dtype, src, dst = problem
    c = CLUSTERS[cluster]
    p = reshard.plan(shape, dtype, src, dst, cluster=c, strategy=strategy)
    steps = data.draw(st.lists(st.integers(0, 3), min_size=len(p.tasks),
                               max_size=len(p.tasks)))
    for q in (p, ReshardPlan(p.tensors, tuple(replace(t, step=s) for t, s in
                                             zip(p.tasks, steps, strict=True)),
                             p.strategy, c)):
        floor, model = cost.stepped_floor(q), cost.simulate(q).time
        assert 0 <= floor <= model * (1 + 1e-9) + 1e-15, (floor, model)


@pytest.mark.parametrize("strategy", ["send_recv", "broadcast"])
def test_one_task_per_step_the_floor_is_the_prediction(strategy):
    """Tasks one after another (a step each): nothing shares, so the model's
    prediction is each task alone, back to back, and the floor must equal it."""
    cluster = Cluster.preset("dgx-h100", 2)
    a, b = DeviceMesh((2, 4), range(8)), DeviceMesh((2, 4), range(8, 16))
    p = reshard.plan((1024, 512), "bfloat16", Layout(a, "S0S1"), Layout(b, "S1R"),
                     cluster=cluster, strategy=strategy)
    serial = ReshardPlan(p.tensors, tuple(replace(t, step=i) for i, t in enumerate(p.tasks)),
                         p.strategy, cluster)
    assert len(serial.tasks) > 4
    assert cost.stepped_floor(serial) == pytest.approx(cost.simulate(serial).time, rel=1e-9)
    # concurrent, it is below (the tasks share links)
    assert cost.stepped_floor(p) <= cost.simulate(p).time


def test_the_budget_skips_first_fit_only_where_it_cannot_win(monkeypatch):
    """Under a byte budget the planner keeps the even buckets without simulating first
    fit where first fit's floor is above them, and the plan is the one a comparison of
    both predictions picks."""
    cluster = Cluster.preset("dgx-h100", 2)
    few = Layout(DeviceMesh((2,), [0, 1]), "S0RR")
    many = Layout(DeviceMesh((8,), range(8, 16)), "RS0R")
    dense = Layout(DeviceMesh((8,), range(8)), "S0R")
    wide = Layout(DeviceMesh((8,), range(8, 16)), "RS0")
    reqs = [((16, 2048, 1024), "bfloat16", few, many), ((4096, 4096), "bfloat16", dense, wide)]
    budget = 3 << 20
    floors: list[float] = []

    def floor(p: ReshardPlan) -> float:
        floors.append(cost.stepped_floor(p))
        return floors[-1]

    monkeypatch.setattr(planner, "stepped_floor", floor)
    chosen = reshard.plan_many(reqs, cluster=cluster, memory_budget=budget)
    assert floors, "the floor was not consulted"
    monkeypatch.setattr(planner, "stepped_floor", lambda p: 0.0)  # always simulate both
    both = reshard.plan_many(reqs, cluster=cluster, memory_budget=budget)
    assert chosen.digest() == both.digest()

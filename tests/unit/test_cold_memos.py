"""Cold costs (issue 62, round two): what one planning call finds once and reuses
changes no plan and no number.

Each memo of :class:`~reshard.planner.plan.Builds` (a candidate priced as an earlier one
of the same tasks; every strategy's cells cut once; a ``fine`` cut that splits nothing
further planned as the coarse one) against a planning call with it switched off: the
same tasks, the same model seconds, bit for bit, over random layout pairs (partial
sums, uneven shapes, overlapping meshes) and a partial sum's pipelined pieces.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.errors import PlanError
from reshard.planner.costing.cost import lower_bound
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import Builds, Cut, _best_plan, cut_cells, planned_tensors
from reshard.planner.search.twins import Twins
from reshard.planner.values.strategy import Strategy

from ..common import problems
from .test_cold_costs import CLUSTERS, partial_moves


class _NoTwins(Twins):
    def adopt(self, plan: ReshardPlan) -> ReshardPlan:
        return plan


class Unshared(Builds):
    """A planning call's memo with its round-two memos off: every candidate simulated,
    every strategy's cells cut anew, every ``fine`` cut planned."""

    def __init__(self) -> None:
        super().__init__()
        self.twins = _NoTwins()

    def cut(self, tensors, cluster, fuse, fine) -> Cut:
        return cut_cells(tensors, cluster, fuse, fine)

    def _fine_as_coarse(self, *args) -> bool:
        return False


def _same_plans(tensors, cluster, strategy):
    fast = _best_plan(tensors, cluster, strategy)
    slow = _best_plan(tensors, cluster, strategy, Unshared())
    assert fast.tasks == slow.tasks
    assert fast.strategy is slow.strategy
    assert fast.estimate() == slow.estimate()  # bit for bit
    assert Builds().bound(tensors, cluster) == lower_bound(tensors, cluster)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.data(), st.sampled_from(CLUSTERS), st.sampled_from(list(Strategy)))
def test_the_memos_change_no_plan_any_layouts(data, cluster, strategy):
    shape, dtype, src, dst = data.draw(problems(cluster.devices, max_ndim=2, max_size=6))
    shape = tuple(d * 1024 for d in shape)  # cells large enough to split for balance
    tensors, _ = planned_tensors([(shape, dtype, src, dst)], cluster, None, None)
    _same_plans(tensors, cluster, strategy)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(partial_moves(rows_of=64), st.sampled_from(list(Strategy)))
def test_the_memos_change_no_plan_partial_sums(move, strategy):
    shape, dtype, src, dst, cluster = move
    tensors, _ = planned_tensors([(shape, dtype, src, dst)], cluster, None, None)
    _same_plans(tensors, cluster, strategy)


def test_a_plan_priced_as_another_reads_its_numbers_and_refuses_other_tasks():
    cluster = Cluster.preset("dgx-h100", 2)
    a, b = DeviceMesh((8,), range(8)), DeviceMesh((8,), range(8, 16))
    p = reshard.plan((4096, 64), "float32", Layout(a, "S0R"), Layout(b, "RR"),
                      cluster=cluster)
    twin = ReshardPlan(p.tensors, p.tasks, Strategy.SEND_RECV, p.cluster).priced_as(p)
    assert twin.estimate() == p.estimate() and twin.simulate() is p.simulate()
    assert twin.routes() is p.routes()
    other = ReshardPlan(p.tensors, p.tasks[1:], p.strategy, p.cluster)
    with pytest.raises(PlanError, match="same tensors, tasks and cluster"):
        other.priced_as(p)
    memo = Twins()
    assert memo.adopt(p) is p
    again = memo.adopt(ReshardPlan(p.tensors, p.tasks, p.strategy, p.cluster))
    assert again.estimate() == p.estimate() and again.simulate() is p.simulate()


def test_an_all_gathers_floor_adds_its_steps(monkeypatch):
    """All-gathered pieces enter through the NICs, then pass through the links at the
    next step: the floor counts both, one after the other, and stays below the
    baseline's searched plan."""
    from reshard.planner.schedule import floors

    cluster = Cluster.preset("dgx-h100", 4)
    a, b = DeviceMesh((2, 8), range(16)), DeviceMesh((2, 8), range(16, 32))
    tensors, _ = planned_tensors([((8192, 4096), "bfloat16", Layout(a, "S10R"),
                                   Layout(b, "RR"))], cluster, None, None)
    memo = Builds()
    stepped = memo.floor(tensors, cluster, Strategy.ALLGATHER)
    monkeypatch.setattr(floors, "_stepped", lambda load, cluster: 0.0)
    busiest = Builds().floor(tensors, cluster, Strategy.ALLGATHER)
    assert stepped > 1.1 * busiest
    assert stepped <= _best_plan(tensors, cluster, Strategy.ALLGATHER).estimate()

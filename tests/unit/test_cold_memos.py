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
from reshard.planner.builds import Builds
from reshard.planner.costing.bound import lower_bound
from reshard.planner.cuts import Cut, cut_cells
from reshard.planner.ir import ReshardPlan
from reshard.planner.passes.twins import Twins
from reshard.planner.plan import _best_plan, planned_tensors
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
    monkeypatch.setattr(floors, "_stepped", lambda load, cluster, wait: 0.0)
    busiest = Builds().floor(tensors, cluster, Strategy.ALLGATHER)
    assert stepped > 1.1 * busiest
    assert stepped <= _best_plan(tensors, cluster, Strategy.ALLGATHER).estimate()


LARGE = (("S01R", "RS10"), ("S10R", "RS01"), ("RS01", "S10R"), ("S0S1", "RS10"),
         ("RR+P0", "S01R"), ("S1R+P0", "RS10"))
"""Layout pairs whose first plan on (4, 8) or (8, 8) meshes has more tasks than any
search pass looks at: most of them sends kept as columns."""


@settings(max_examples=16, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(LARGE), st.sampled_from(["dgx-h100", "aws-p4d.24xlarge", "paper"]),
       st.sampled_from([Strategy.BROADCAST, Strategy.SEND_RECV]), st.booleans(),
       st.integers(0, 7), st.integers(0, 5), st.randoms(use_true_random=False))
def test_a_large_plan_priced_from_its_columns_is_the_plans_own(pair, preset, strategy,
                                                               overlap, dr, dc, rng):
    """Uneven shapes, meshes on shuffled devices, disjoint or the same devices: the
    columns' seconds are the whole plan's, bit for bit."""
    from reshard.planner.costing import columns
    from reshard.planner.plan import estimate_tensors, plan_tensors

    rows = 4 if pair[0].endswith("+P0") else 8
    per = 4 if preset == "paper" else 8
    cluster = Cluster.preset(preset, 2 * rows)
    devices = list(cluster.devices)
    rng.shuffle(devices)
    n = rows * per
    src = Layout(DeviceMesh((rows, per), devices[:n]), pair[0])
    pool = devices[:n] if overlap else devices[n:2 * n]
    rng.shuffle(pool)
    dst = Layout(DeviceMesh((rows, per), pool), pair[1])
    shape = (4096 + dr * 3, 2048 - dc)
    tensors, _ = planned_tensors([(shape, "bfloat16", src, dst)], cluster, None, None)
    used: list[float | None] = []
    real = columns.estimate_columns

    def spy(*args, **kwargs):
        used.append(real(*args, **kwargs))
        return used[-1]

    import reshard.planner.plan as plan_module
    plan_module.estimate_columns = spy
    try:
        fast = estimate_tensors(tensors, cluster, strategy)
    finally:
        plan_module.estimate_columns = real
    whole = plan_tensors(tensors, cluster, strategy, None)
    assert fast == whole.estimate()
    assert (len(whole.tasks) > 2048) == bool(used)
    assert all(u is not None for u in used)


def test_a_large_plan_on_a_shared_bandwidth_is_built_whole():
    from reshard.planner.builds import Builds as Memo
    from reshard.planner.costing.columns import estimate_columns
    from reshard.planner.plan import estimate_tensors, plan_tensors

    cluster = Cluster.regular(4, 8, shared_bandwidth=5e10, message_cost=2e-5)
    a, b = DeviceMesh((2, 8), range(16)), DeviceMesh((2, 8), range(16, 32))
    tensors, _ = planned_tensors([((8192, 64), "float32", Layout(a, "S01R"),
                                   Layout(b, "S10R"))], cluster, None, None)
    ordered = Memo().columns(tensors, cluster, Strategy.BROADCAST, False)
    assert ordered is not None
    assert estimate_columns(ordered[0], tensors, cluster) is None
    assert estimate_tensors(tensors, cluster, Strategy.BROADCAST) == \
        plan_tensors(tensors, cluster, Strategy.BROADCAST, None).estimate()


@pytest.mark.parametrize("strategy", ["broadcast", "send_recv"])
def test_a_plan_with_its_memos_pickles_and_keeps_only_portable_figures(strategy):
    """A plan holding what finds its bound (a closure over a planning call's memo, as a
    first plan does until asked; a service worker sends such plans back) pickles all
    the same: equal to itself, its figures kept, its process-local caches dropped."""
    import pickle

    from reshard.planner.ir import PORTABLE_CACHE

    src = Layout(DeviceMesh((2, 4)), "S0R")
    dst = Layout(DeviceMesh((2, 4), devices=range(8, 16)), "RS01")
    cluster = Cluster.regular(4, 4)
    planned = reshard.plan((64, 96), "float32", src, dst, cluster=cluster, strategy=strategy)
    p = ReshardPlan(planned.tensors, planned.tasks, planned.strategy, cluster).bound_by(
        Builds().bound_of(planned.tensors, cluster))
    p.estimate()
    assert "bound of" in p._cache  # the closure, not yet called
    back = pickle.loads(pickle.dumps(p))
    assert back == p and back.tasks == p.tasks
    assert set(back._cache) <= PORTABLE_CACHE
    assert "estimate" in back._cache and back.estimate() == p.estimate()
    assert back.lower_bound() == lower_bound(p.tensors, cluster) == p.lower_bound()

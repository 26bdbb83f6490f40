"""The ``least-concurrent`` pass's floor found once for a planning call's twins (issue
62, round six): a plan priced as an earlier one with the same tasks reads that plan's
floor (:meth:`ReshardPlan.one_at_a_time_time`), which is the floor found afresh, and
never above the serial candidate's model time."""

from __future__ import annotations

import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.builds import Builds
from reshard.planner.costing.cost import one_at_a_time_time
from reshard.planner.ir import ReshardPlan
from reshard.planner.passes import stages
from reshard.planner.plan import _best_plan, planned_tensors
from reshard.planner.schedule.order import one_at_a_time
from reshard.planner.values.strategy import Strategy

CLUSTER = Cluster.preset("dgx-h100", 8)
MESH = DeviceMesh((4, 8), range(32))
MOVES = [("RR+P0", "RS0", (4096, 1024)), ("S0R+P1", "RS0", (1024, 512)),
         ("RR+P01", "S1R", (2048, 256)), ("RS1+P0", "S0S1", (1000, 251)),
         ("S1R+P0", "RR", (512, 512))]


def _fresh(plan: ReshardPlan) -> ReshardPlan:
    """The same tasks as a plan of their own (no twin, no cache)."""
    return ReshardPlan(plan.tensors, plan.tasks, plan.strategy, plan.cluster)


def test_twins_read_the_floor_found_afresh(monkeypatch):
    seen: list[tuple[ReshardPlan, float]] = []
    floor = stages._serial_floor

    def recorded(search, start):
        got = floor(search, start)
        seen.append((start, got))
        return got

    monkeypatch.setattr(stages, "STAGES", tuple(
        tuple(stages.Pass(p.name, p.up_to, p.propose, p.keep, recorded)
              if p.floor is floor else p for p in stage) for stage in stages.STAGES))
    monkeypatch.setattr(stages.search, "__defaults__",
                        (stages.STAGES, *stages.search.__defaults__[1:]))
    for src, dst, shape in MOVES:
        tensors, _ = planned_tensors(
            [(shape, "float32", Layout(MESH, src), Layout(MESH, dst))], CLUSTER, None, None)
        _best_plan(tensors, CLUSTER, Strategy.BROADCAST, Builds())
    assert len(seen) >= len(MOVES)
    twins = [(p, f) for p, f in seen if "twin" in p._cache]
    assert twins  # some floors were read through a twin
    for plan, got in seen:
        assert got == one_at_a_time_time(_fresh(plan))


@pytest.mark.parametrize("src,dst,shape", MOVES)
def test_the_floor_is_never_above_the_serial_candidates_time(src, dst, shape):
    tensors, _ = planned_tensors(
        [(shape, "float32", Layout(MESH, src), Layout(MESH, dst))], CLUSTER, None, None)
    for strat in Strategy:
        plan = _best_plan(tensors, CLUSTER, strat, Builds())
        serial = ReshardPlan(plan.tensors, one_at_a_time(plan.tasks), plan.strategy,
                             plan.cluster)
        assert plan.one_at_a_time_time() <= serial.estimate() * (1 + 1e-9)
        assert plan.one_at_a_time_time() == one_at_a_time_time(_fresh(plan))

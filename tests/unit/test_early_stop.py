"""A simulation told to stop once its plan cannot beat a time: the search's answers
stay exactly those of full simulations, and a stopped one is never an estimate."""

from __future__ import annotations

import functools

import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.costing.fluid import EXACT_UP_TO, simulate
from reshard.planner.ir import ReshardPlan
from reshard.planner.passes.stages import faster, faster_by_tree_gain, within_relay_gain

CL = Cluster.preset("dgx-h100", 2)
MESH = DeviceMesh((2, 8), range(16))

CASES = [((1 << 22,), "R+P01", "R"), ((1 << 20,), "R+P0", "R"), ((512, 4096), "S0R", "RS1"),
         ((256, 2048), "S0R+P1", "RS0"), ((1 << 21,), "S0", "R")]


BIG = DeviceMesh((8, 8), range(64))


@functools.cache
def _plans() -> tuple[ReshardPlan, ...]:
    out = [reshard.plan(shape, "bfloat16", Layout(MESH, s), Layout(MESH, d), cluster=CL)
           for shape, s, d in CASES]
    # over EXACT_UP_TO tasks (8,448): the simulation refills late, rates held between
    big = reshard.plan((1 << 26,), "bfloat16", Layout(BIG, "R+P01"), Layout(BIG, "R"),
                       cluster=Cluster.preset("dgx-h100", 8), strategy="allgather")
    assert len(big.tasks) > EXACT_UP_TO
    return (*out, big)


def _fresh(plan: ReshardPlan) -> ReshardPlan:
    return ReshardPlan(plan.tensors, plan.tasks, plan.strategy, plan.cluster)


@pytest.mark.parametrize("plan", _plans(),
                         ids=[*(f"{s}->{d}" for _, s, d in CASES), "allgather-8x8"])
def test_a_stop_never_changes_a_finished_simulation_and_stops_a_slower_plan(plan):
    full = simulate(plan)
    assert full is not None and full.time > 0
    for share in (0.3, 0.9, 0.999, 1.0, 1.001, 1.5):
        threshold = full.time * share
        got = simulate(_fresh(plan), lambda t, x=threshold: t >= x)
        if got is None:  # stopped: only where the full time is not below the threshold
            assert full.time >= threshold
        else:
            assert got == full
    # far below the threshold a full simulation would be wasted: it stops
    assert simulate(_fresh(plan), lambda t: t >= full.time * 0.3) is None


@pytest.mark.parametrize("keep", [faster, faster_by_tree_gain, within_relay_gain])
def test_kept_answers_as_the_rule_on_the_estimate_and_remembers_only_estimates(keep):
    for plan in _plans():
        time = plan.estimate()
        for share in (0.5, 0.995, 0.9999999, 1.0, 1.0000001, 1.005, 2.0):
            best = time * share
            fresh = _fresh(plan)
            assert fresh.kept(keep, best) == keep(time, best)
            est = fresh._cache.get("estimate")
            assert est is None or est.time == time  # a stopped run leaves nothing
            assert fresh.estimate() == time
            twin = _fresh(plan).priced_as(fresh)  # asks its twin, priced already
            assert twin.kept(keep, best) == keep(time, best)

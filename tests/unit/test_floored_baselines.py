"""``plan.floored``: the all-gather baseline of a partial-sum source is planned without
asking its floor first. The plan is the one found when the floor is asked (a floor
rules out only a baseline that could not be kept); the floor is not found at all."""

from __future__ import annotations

from hypothesis import given, settings

import reshard.planner.plan as planner
from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.builds import Builds
from reshard.planner.plan import _best_plan, floored, planned_tensors
from reshard.planner.values.strategy import Strategy

from .test_cold_costs import partial_moves


class _Asked(Builds):
    """A memo that records which baselines' floors were asked."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[Strategy] = []

    def beaten(self, tensors, cluster, baseline, seconds):  # type: ignore[no-untyped-def]
        self.asked.append(baseline)
        return super().beaten(tensors, cluster, baseline, seconds)


def _tensors(src: str, dst: str):
    cluster = Cluster.preset("dgx-h100", 8)
    a, b = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))
    tensors, _ = planned_tensors([((8192, 8192), "bfloat16", Layout(a, src), Layout(b, dst))],
                                 cluster, None, None)
    return tensors, cluster


def test_only_a_partial_sources_allgather_goes_unfloored():
    partial, _ = _tensors("RS1+P0", "RR")
    plain, _ = _tensors("S0R", "RR")
    assert not floored(partial, Strategy.ALLGATHER)
    assert floored(partial, Strategy.SEND_RECV)
    assert floored(plain, Strategy.ALLGATHER) and floored(plain, Strategy.SEND_RECV)


def test_the_allgather_floor_that_ruled_it_out_is_not_asked_and_the_plan_stays(monkeypatch):
    # on the 4x8 set, one of the few partial requests whose all-gather floor (1.075 of
    # the plan to beat) ruled the baseline out
    tensors, cluster = _tensors("RS1+P0", "RR")
    memo = _Asked()
    fast = _best_plan(tensors, cluster, Strategy.BROADCAST, memo)
    assert Strategy.ALLGATHER not in memo.asked
    monkeypatch.setattr(planner, "floored", lambda tensors, baseline: True)  # as before
    old = _Asked()
    slow = _best_plan(tensors, cluster, Strategy.BROADCAST, old)
    assert Strategy.ALLGATHER in old.asked
    assert old.beaten(tensors, cluster, Strategy.ALLGATHER, slow.estimate())  # it ruled it out
    assert fast.tasks == slow.tasks and fast.estimate() == slow.estimate()


@settings(max_examples=10, deadline=None, derandomize=True, database=None)
@given(partial_moves(rows_of=64))
def test_a_partial_sources_plan_is_the_one_with_every_floor_asked(move):
    shape, dtype, src, dst, cluster = move
    tensors, _ = planned_tensors([(shape, dtype, src, dst)], cluster, None, None)
    fast = _best_plan(tensors, cluster, Strategy.BROADCAST)
    saved = planner.floored
    planner.floored = lambda tensors, baseline: True  # every floor asked, as before
    try:
        slow = _best_plan(tensors, cluster, Strategy.BROADCAST)
    finally:
        planner.floored = saved
    assert fast.tasks == slow.tasks and fast.estimate() == slow.estimate()

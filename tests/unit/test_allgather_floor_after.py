"""The ``allgather`` baseline's floor asked only where ``send_recv``'s ruled ``send_recv``
out (issue 62, round nine, :func:`reshard.planner.plan._best_plan`): where it is not
asked, the baseline is planned, and the plan is the one found with no floor at all (a
floor rules out only a baseline that could not be kept); every baseline left unplanned
had a floor not below the plan kept."""

from __future__ import annotations

import pytest

import reshard.planner.plan as planner
from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.builds import Builds
from reshard.planner.plan import _best_plan, planned_tensors
from reshard.planner.values.strategy import Strategy

best_plan = _best_plan  # the function itself, while the module's name is recorded


class _Asked(Builds):
    """A memo that records each baseline's floor question and answer (``never``: every
    answer no, so every baseline is planned)."""

    def __init__(self, never: bool = False) -> None:
        super().__init__()
        self.asked: list[tuple[Strategy, bool]] = []
        self.never = never

    def beaten(self, tensors, cluster, baseline, seconds):  # type: ignore[no-untyped-def]
        got = False if self.never else super().beaten(tensors, cluster, baseline, seconds)
        self.asked.append((baseline, got))
        return got


def _tensors(src: str, dst: str, shape: tuple[int, int], cross: bool):
    """4x8 on dgx-h100, one mesh to another (the cold set's: bfloat16) or within one."""
    a = DeviceMesh((4, 8), range(32))
    b = DeviceMesh((4, 8), range(32, 64)) if cross else a
    cluster = Cluster.preset("dgx-h100", 8 if cross else 4)
    tensors, _ = planned_tensors(
        [(shape, "bfloat16" if cross else "float32", Layout(a, src), Layout(b, dst))],
        cluster, None, None)
    return tensors, cluster


MOVES = [("RS10", "S0R", (2048, 2048), True), ("S10R", "RS0", (8192, 8192), True),
         ("RS1", "S0R", (2048, 2048), True), ("S0R", "RR", (2048, 2048), True),
         ("S01R", "RR", (1024, 1024), False), ("RS01", "S0R", (4096, 4096), False),
         ("S0S1", "RR", (1024, 1024), False), ("RR+P0", "S0R", (2048, 2048), True),
         ("RR+P01", "S0R", (2048, 2048), True)]
"""Requests where ``send_recv``'s floor rules it out and ``allgather``'s does or does
not, where neither does, and partial sums (``allgather`` never floored; the last one's
``send_recv`` not ruled out: since round eleven's host floor,
:mod:`reshard.planner.passes.send_floor`, every plain one here is)."""


@pytest.mark.parametrize("src,dst,shape,cross", MOVES)
def test_the_plan_is_the_one_found_with_no_floor(src, dst, shape, cross, monkeypatch):
    tensors, cluster = _tensors(src, dst, shape, cross)
    memo, plain = _Asked(), _Asked(never=True)
    planned: list[Strategy] = []

    def recorded(tensors, cluster, strat, builds=None):  # type: ignore[no-untyped-def]
        planned.append(strat)
        return best_plan(tensors, cluster, strat, builds)

    monkeypatch.setattr(planner, "_best_plan", recorded)
    got = best_plan(tensors, cluster, Strategy.BROADCAST, memo)
    monkeypatch.undo()
    every = _best_plan(tensors, cluster, Strategy.BROADCAST, plain)
    assert got.tasks == every.tasks and got.estimate() == every.estimate()
    asked = dict(memo.asked)
    if Strategy.ALLGATHER in asked:  # asked only after send_recv's floor ruled it out
        assert asked.get(Strategy.SEND_RECV) is True
    # every baseline left unplanned had a floor (found afresh) not below the plan kept
    fresh = Builds()
    if Strategy.SEND_RECV in asked:  # the baselines were looked at
        for baseline in (Strategy.SEND_RECV, Strategy.ALLGATHER):
            if baseline not in planned:
                assert fresh.beaten(tensors, cluster, baseline, got.estimate())


def test_each_case_occurs():
    seen = set()
    for src, dst, shape, cross in MOVES:
        tensors, cluster = _tensors(src, dst, shape, cross)
        memo = _Asked()
        _best_plan(tensors, cluster, Strategy.BROADCAST, memo)
        seen.add(tuple(memo.asked))
    sr, ag = Strategy.SEND_RECV, Strategy.ALLGATHER
    assert ((sr, True), (ag, True)) in seen  # both ruled out
    assert ((sr, True), (ag, False)) in seen  # allgather asked and planned
    assert ((sr, False),) in seen  # allgather planned without its floor

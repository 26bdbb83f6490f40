"""``point-to-point`` ruled out where its start plan has no relay (issue 62, round
fourteen): the pass proposes nothing there (every task already has one receiver), so its
quicker proof says so before it finds the send floor (:attr:`~reshard.planner.passes.
stages.Search.sends_floor`, about 0.6 ms on a plan of 1,024 tasks; on every third 4x8
cold request 69 of 196 send floors were found for such plans). Every plan is the same as
with the proof it replaces (the send floor asked first, always)."""

from __future__ import annotations

import pytest

import reshard.planner.plan as planner
from reshard.planner.builds import Builds
from reshard.planner.passes import stages
from reshard.planner.plan import _best_plan
from reshard.planner.values.strategy import Strategy
from tests.unit.test_send_floor import CASES, _tensors

MORE = [([(s, d)], shape, how)
        for s, d in [("S10R", "RS01"), ("RS01", "S10R"), ("RS0", "S1R"), ("S0R", "RS1"),
                     ("RR+P01", "S10R"), ("RR", "RS1")]
        for shape, how in [((2048, 2048), "cross"), ((1000, 520), "overlap"),
                           ((1024, 1024), "same")]]
"""All-to-all moves (one receiver a task: no relay), replicated ones (chains), a sum
onto a sharded layout; across meshes, overlapping ones, within one; even and uneven."""


def _pass() -> stages.Pass:
    return next(p for stage in stages.STAGES for p in stage if p.name == "point-to-point")


def _old_ruled_out(search, start, keeps):  # type: ignore[no-untyped-def]
    """The proof before this round: the send floor alone, relays or not."""
    return search.sends_floor is not None and not keeps(search.sends_floor())


def _first(tensors, cluster, strat=Strategy.BROADCAST):  # type: ignore[no-untyped-def]
    memo = Builds()
    tasks = memo.whole(tensors, cluster, strat, False)[0]
    return memo, planner.ReshardPlan(tensors, tasks, strat, cluster)


@pytest.mark.parametrize("moves,shape,how", CASES + MORE)
def test_every_plan_is_the_same(moves, shape, how, monkeypatch):
    tensors, cluster = _tensors(moves, shape, how)
    got = _best_plan(tensors, cluster, Strategy.BROADCAST, Builds())
    monkeypatch.setattr(stages, "_point_to_point_ruled_out", _old_ruled_out)
    monkeypatch.setattr(stages, "STAGES", tuple(
        tuple(stages.Pass(p.name, p.up_to, p.propose, p.keep, p.floor, _old_ruled_out)
              if p.name == "point-to-point" else p for p in stage) for stage in stages.STAGES))
    search = stages.search
    monkeypatch.setattr(planner, "search",
                        lambda *a, **k: search(*a, stages=stages.STAGES, **k))
    old = _best_plan(tensors, cluster, Strategy.BROADCAST, Builds())
    assert got.tasks == old.tasks and got.estimate() == old.estimate()


@pytest.mark.parametrize("moves,shape,how", CASES + MORE)
def test_ruled_out_without_relays_exactly_where_nothing_is_proposed(moves, shape, how):
    """No relay: ruled out with no send floor asked, and the pass proposes nothing.
    A relay: the send floor decides, as before."""
    tensors, cluster = _tensors(moves, shape, how)
    memo, first = _first(tensors, cluster)
    asked: list[int] = []

    def sends() -> float:
        asked.append(1)
        return memo.send_floor(tensors, cluster)

    s = stages.Search(tensors, cluster, Strategy.BROADCAST, first, False, memo,
                      sends_floor=sends)
    relays = any(len(t.receivers) > 1 for t in first.tasks)
    p = _pass()
    assert p.ruled_out is not None
    for keeps in (lambda t: True, lambda t: False):
        asked.clear()
        got = p.ruled_out(s, first, keeps)
        if relays:
            assert asked == [1] and got == _old_ruled_out(s, first, keeps)
        else:
            assert asked == [] and got
            assert list(p.propose(s, first)) == []


def test_some_cases_have_no_relay_and_some_have():
    """The cases above hold both kinds of start plan (the test is not vacuous)."""
    kinds = set()
    for moves, shape, how in MORE:
        tensors, cluster = _tensors(moves, shape, how)
        kinds.add(any(len(t.receivers) > 1 for t in _first(tensors, cluster)[1].tasks))
    assert kinds == {True, False}


@pytest.mark.parametrize("strat", [Strategy.SEND_RECV, Strategy.ALLGATHER])
def test_not_a_broadcast_is_ruled_out(strat):
    """Only a broadcast search has a ``point-to-point`` candidate: another is ruled
    out with no floor asked, even where its tasks have several receivers (an
    all-gather's)."""
    tensors, cluster = _tensors([("S0R", "RR")], (1024, 1024), "cross")
    memo, first = _first(tensors, cluster, strat)
    assert (strat is Strategy.ALLGATHER) == any(len(t.receivers) > 1 for t in first.tasks)
    s = stages.Search(tensors, cluster, strat, first, False, memo,
                      sends_floor=lambda: 1 / 0)
    p = _pass()
    assert p.ruled_out is not None and p.ruled_out(s, first, lambda t: True)
    assert list(p.propose(s, first)) == []

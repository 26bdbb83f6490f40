"""The ``send_recv`` floor asked before its slices are cut (issue 62, round twelve):
:meth:`~reshard.planner.plan.Builds.send_floor` is the send floor of each cut's cells,
never above the ``send_recv`` floor it is part of (:meth:`Builds.floor`) nor above a
``send_recv`` plan; :meth:`Builds.beaten` answers as it did when it asked
:meth:`Builds.floor` alone; and every plan is the same where ``point-to-point`` and the
``send_recv`` baseline are ruled out by it first (the path it replaces: the slices'
floor and the send floor together, always)."""

from __future__ import annotations

import pytest

import reshard.planner.plan as planner
from reshard.planner.builds import Builds
from reshard.planner.passes import stages
from reshard.planner.plan import _best_plan
from reshard.planner.values.strategy import Strategy
from tests.unit.test_send_floor import CASES, _floor, _tensors

MORE = [([(s, d)], shape, "cross")
        for s, d in [("S1R+P0", "RR"), ("RR+P1", "RR"), ("RR+P0", "RS0"), ("S0R", "RS1"),
                     ("RR", "RS0"), ("RS1+P0", "S1R")]
        for shape in [(2048, 2048), (1000, 520)]]
"""Partial sources whose send floor alone rules ``send_recv`` out on the cold set (the
slowest 4x8 requests), plain ones, even and uneven."""


def _old_beaten(self, tensors, cluster, baseline, seconds):  # type: ignore[no-untyped-def]
    """:meth:`Builds.beaten` before this round: each cut's whole floor, always."""
    cuts = (False, True) if any(t.src.spec.is_partial for t in tensors) else (False,)
    return all(self.floor(tensors, cluster, baseline, fine) >= seconds for fine in cuts)


@pytest.mark.parametrize("moves,shape,how", CASES + MORE)
def test_the_send_floor_is_the_cuts_and_below_the_floor(moves, shape, how):
    tensors, cluster = _tensors(moves, shape, how)
    memo = Builds()
    for fine in (False, True):
        got = memo.send_floor(tensors, cluster, fine)
        assert got == _floor(Builds(), tensors, cluster, fine)
    coarse = memo.send_floor(tensors, cluster)
    assert coarse <= memo.floor(tensors, cluster, Strategy.SEND_RECV)
    # the search's result, from either cut (a partial sum's finer cut reduces otherwise)
    assert min(memo.send_floor(tensors, cluster, f) for f in (False, True)) <= \
        _best_plan(tensors, cluster, Strategy.SEND_RECV, Builds()).estimate()


@pytest.mark.parametrize("moves,shape,how", CASES + MORE)
def test_beaten_answers_as_the_floor_alone(moves, shape, how):
    tensors, cluster = _tensors(moves, shape, how)
    memo = Builds()
    marks = {memo.send_floor(tensors, cluster, f) for f in (False, True)} | \
        {memo.floor(tensors, cluster, Strategy.SEND_RECV, f) for f in (False, True)}
    for seconds in [*sorted(marks), 0.0, 1.0]:
        for at in (seconds * (1 - 1e-12), seconds, seconds * (1 + 1e-12)):
            assert Builds().beaten(tensors, cluster, Strategy.SEND_RECV, at) == \
                _old_beaten(memo, tensors, cluster, Strategy.SEND_RECV, at)


def _without(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The path replaced: no send floor asked first, by the search or the baselines."""
    search = stages.search
    monkeypatch.setattr(planner, "search", lambda *a, sends_floor=None, **k: search(*a, **k))
    monkeypatch.setattr(Builds, "beaten", _old_beaten)


@pytest.mark.parametrize("moves,shape,how", CASES + MORE)
def test_every_plan_is_the_same(moves, shape, how, monkeypatch):
    tensors, cluster = _tensors(moves, shape, how)
    got = _best_plan(tensors, cluster, Strategy.BROADCAST, Builds())
    _without(monkeypatch)
    every = _best_plan(tensors, cluster, Strategy.BROADCAST, Builds())
    assert got.tasks == every.tasks and got.estimate() == every.estimate()


def _cut_for_sends(monkeypatch) -> int:  # type: ignore[no-untyped-def]
    """Requests of :data:`MORE` whose search cut ``send_recv`` slices."""
    cut = 0
    for moves, shape, how in MORE:
        tensors, cluster = _tensors(moves, shape, how)
        memo = Builds()
        _best_plan(tensors, cluster, Strategy.BROADCAST, memo)
        cut += any(k[2] is Strategy.SEND_RECV for k in memo._signatures)
    return cut


def test_fewer_send_recv_slices_are_cut(monkeypatch):
    """S1R+P0 -> RR and the like: the send floor rules ``point-to-point`` and the
    ``send_recv`` baseline out, and no ``send_recv`` slice is cut for their floor."""
    first = _cut_for_sends(monkeypatch)
    _without(monkeypatch)
    assert first < _cut_for_sends(monkeypatch)


def test_point_to_point_is_ruled_out_first():
    """On S1R+P0 -> RR (the slowest 4x8 request) the quicker proof rules the pass out;
    without a send floor it leaves it to the pass's floor."""
    tensors, cluster = _tensors([("S1R+P0", "RR")], (2048, 2048), "cross")
    memo = Builds()
    best = _best_plan(tensors, cluster, Strategy.BROADCAST, memo)
    first = planner.ReshardPlan(tensors, memo.whole(tensors, cluster, Strategy.BROADCAST,
                                                    False)[0], Strategy.BROADCAST, cluster)
    s = stages.Search(tensors, cluster, Strategy.BROADCAST, first, False, memo,
                      sends_floor=lambda: memo.send_floor(tensors, cluster))
    p = next(p for stage in stages.STAGES for p in stage if p.name == "point-to-point")
    assert p.ruled_out is not None
    assert p.ruled_out(s, first, lambda t: p.keep(t, best.estimate()))
    bare = stages.Search(tensors, cluster, Strategy.BROADCAST, first, False, memo)
    assert not p.ruled_out(bare, first, lambda t: p.keep(t, best.estimate()))


def test_the_proof_is_the_send_floor_itself():
    """``point-to-point``'s quicker proof asks its rule of the coarse cut's send floor
    exactly: ruled out by a rule that keeps only plans below it, not by one that keeps
    a plan at it."""
    tensors, cluster = _tensors([("S0R", "RR")], (2048, 2048), "cross")
    memo = Builds()
    first = planner.ReshardPlan(tensors, memo.whole(tensors, cluster, Strategy.BROADCAST,
                                                    False)[0], Strategy.BROADCAST, cluster)
    floor = memo.send_floor(tensors, cluster)
    s = stages.Search(tensors, cluster, Strategy.BROADCAST, first, False, memo,
                      sends_floor=lambda: floor)
    p = next(p for stage in stages.STAGES for p in stage if p.name == "point-to-point")
    assert p.ruled_out is not None and floor > 0
    assert p.ruled_out(s, first, lambda t: t < floor)
    assert not p.ruled_out(s, first, lambda t: t <= floor)

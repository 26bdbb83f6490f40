"""A plan whose simulation stopped early remembers the answer alone
(:meth:`ReshardPlan.kept`, :func:`~reshard.planner.ir.rejects`): asked again by the same
rule against a time no longer, it answers without simulating, and every answer is the
rule's on the full estimate."""

from __future__ import annotations

import functools
import pickle

import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.costing import fluid
from reshard.planner.ir import REJECTED, ReshardPlan, rejects
from reshard.planner.passes.stages import (
    faster,
    faster_by_split_gain,
    faster_by_tree_gain,
    within_concurrency_gain,
    within_relay_gain,
)

CL = Cluster.preset("dgx-h100", 3)
A = DeviceMesh((2, 8), range(16))
OVER = DeviceMesh((2, 8), range(8, 24))  # shares a host with A

CASES = [((1 << 22,), A, "R+P01", A, "R", "broadcast"),
         ((1000, 3000), A, "S0R+P1", A, "RS0", "broadcast"),  # uneven, a partial sum
         ((768, 2050), A, "RR+P0", OVER, "S1R", "broadcast"),  # overlapping meshes
         ((512, 4096), A, "S0R", OVER, "RS1", "send_recv"),
         ((1 << 20,), A, "R+P0", OVER, "R", "allgather")]

RULES = [faster, faster_by_tree_gain, faster_by_split_gain, within_relay_gain,
         within_concurrency_gain]


@functools.cache
def _plans() -> tuple[ReshardPlan, ...]:
    return tuple(reshard.plan(shape, "bfloat16", Layout(m, s), Layout(n, d), cluster=CL,
                              strategy=strat) for shape, m, s, n, d, strat in CASES)


def _fresh(plan: ReshardPlan) -> ReshardPlan:
    return ReshardPlan(plan.tensors, plan.tasks, plan.strategy, plan.cluster)


class _Count:
    """Counts fluid.simulate's runs (the memo's point: none where it answers)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs = 0
        real = fluid.simulate

        def counted(plan, stop=None):  # type: ignore[no-untyped-def]
            self.runs += 1
            return real(plan, stop)

        monkeypatch.setattr(fluid, "simulate", counted)


SHARES = (0.3, 0.9, 0.995, 0.9999999, 1.0, 1.0000001, 1.005, 1.03, 2.0)


@pytest.mark.parametrize("keep", RULES, ids=[r.__name__ for r in RULES])
@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{c[2]}->{c[4]}" for c in CASES])
def test_every_answer_after_a_stop_is_the_rule_on_the_full_estimate(i, keep, monkeypatch):
    plan = _plans()[i]
    time = plan.estimate()
    count = _Count(monkeypatch)
    for first in SHARES:
        fresh = _fresh(plan)
        assert fresh.kept(keep, time * first) == keep(time, time * first)
        for then in SHARES:  # the same plan asked again, longer and shorter times
            before = count.runs
            got = fresh.kept(keep, time * then)
            assert got == keep(time, time * then)
            if "estimate" not in fresh._cache and time * then <= time * first:
                assert count.runs == before  # answered by the memo: not simulated
        est = fresh._cache.get("estimate")
        assert est is None or est.time == time  # a stopped run leaves no estimate


def test_a_stop_is_remembered_and_answers_shorter_times_without_simulating(monkeypatch):
    plan = _plans()[1]
    time = plan.estimate()
    count = _Count(monkeypatch)
    fresh = _fresh(plan)
    assert not fresh.kept(faster, time * 0.5)
    assert count.runs == 1 and "estimate" not in fresh._cache
    assert fresh._cache[REJECTED] == {faster: time * 0.5}
    assert not fresh.kept(faster, time * 0.5)
    assert not fresh.kept(faster, time * 0.25)
    assert count.runs == 1  # both answered from the memo
    assert not fresh.kept(faster, time * 0.75)  # longer: simulated again, stops again
    assert count.runs == 2 and fresh._cache[REJECTED] == {faster: time * 0.75}
    assert not fresh.kept(faster, time * 0.6)  # shorter than the longest rejected
    assert count.runs == 2
    assert fresh.kept(faster, time * 1.5)  # longer than the plan: simulated, kept
    assert count.runs == 3 and fresh._cache["estimate"].time == time


def test_another_rule_is_not_answered_by_a_rejection(monkeypatch):
    plan = _plans()[2]
    time = plan.estimate()
    count = _Count(monkeypatch)
    fresh = _fresh(plan)
    best = time / (1 + 0.004)  # faster rejects it; within the relay gain keeps it
    assert not fresh.kept(faster, best)
    assert count.runs == 1
    assert fresh.kept(within_relay_gain, best) == within_relay_gain(time, best) is True
    assert count.runs == 2


def test_a_twin_reads_and_writes_the_rejection_of_the_plan_it_is_priced_as(monkeypatch):
    plan = _plans()[0]
    time = plan.estimate()
    count = _Count(monkeypatch)
    first = _fresh(plan)
    assert not first.kept(faster_by_tree_gain, time * 0.8)
    twin = _fresh(plan).priced_as(first)
    assert not twin.kept(faster_by_tree_gain, time * 0.7)
    assert count.runs == 1 and REJECTED not in twin._cache
    assert not twin.kept(faster_by_tree_gain, time * 0.9)  # longer: the twin's own run
    assert count.runs == 2 and first._cache[REJECTED] == {faster_by_tree_gain: time * 0.9}


def test_a_pickled_plan_keeps_no_rejection():
    plan = _fresh(_plans()[3])
    time = _plans()[3].estimate()
    assert not plan.kept(faster, time * 0.5)
    assert REJECTED in plan._cache
    back = pickle.loads(pickle.dumps(plan))
    assert REJECTED not in back._cache and back.estimate() == time


def test_rejects():
    assert not rejects(None, faster, 1.0)
    assert not rejects({}, faster, 1.0)
    assert rejects({faster: 2.0}, faster, 2.0)
    assert rejects({faster: 2.0}, faster, 1.0)
    assert not rejects({faster: 2.0}, faster, 2.0000001)
    assert not rejects({faster: 2.0}, within_relay_gain, 1.0)

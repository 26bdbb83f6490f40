"""The ``allgather`` baseline's receipts floor (:mod:`reshard.planner.passes.gather_floor`),
asked by ``Builds.beaten`` before the slices' whole floor: no higher than that floor
(its loads are a part of the whole floor's), below the searched all-gather plan, and
the plan kept is the one with every baseline built."""

from __future__ import annotations

import pytest

from reshard.planner.builds import Builds
from reshard.planner.cuts import cut_slices
from reshard.planner.passes import gather_floor
from reshard.planner.passes.gather_floor import receipts, receipts_floor
from reshard.planner.plan import _best_plan, plan_tasks
from reshard.planner.schedule.floors import baseline_floor, reduction_loads
from reshard.planner.values.resources import DEV_IN
from reshard.planner.values.strategy import Strategy

from .test_held_allgather_floor import CASES, H100, SMALL, _Never, _tensors

MORE = [("S01R", "RR", (8192, 8192), "cross"), ("RS10", "S1R", (2048, 2048), "cross"),
        ("S0S1", "RR", (16384, 4096), "cross"), ("RS01", "S0R", (1000, 3000), "cross"),
        ("S01R", "RS10", (2048, 2048), "overlap"), ("S10R", "RR", (999, 77), "same"),
        ("S1S0", "S0R", (4096, 4100), "overlap"), ("RR+P0", "RS0", (2048, 2048), "cross"),
        ("S0R+P1", "RR", (1024, 4096), "overlap")]
"""Sources of one holder a cell (the all-to-all kinds, to replicated and sharded
layouts; uneven and tiny shapes) and partial sums (the reduced pieces' roots hold
them), beside :data:`CASES`' replicated sources."""


def _floors(tensors, cluster):
    s = cut_slices(tensors, cluster, Strategy.ALLGATHER)
    return (receipts_floor(s.work, s.itemsizes, cluster),
            baseline_floor(s.work, s.reduces, s.itemsizes, cluster, Strategy.ALLGATHER))


@pytest.mark.parametrize("src,dst,shape,how", CASES + MORE)
@pytest.mark.parametrize("cluster", [H100, SMALL], ids=["h100", "small"])
def test_no_higher_than_the_whole_floor_and_below_the_plan(src, dst, shape, how, cluster):
    dims = (4, 8) if cluster is H100 else (2, 3)
    tensors = _tensors(src, dst, shape, how, cluster, dims)
    receipts, whole = _floors(tensors, cluster)
    assert receipts <= whole * (1 + 1e-12)  # 0.0 where every slice is a plain send
    assert receipts <= _best_plan(tensors, cluster, Strategy.ALLGATHER).estimate()


def test_it_rules_out_where_the_whole_floor_did():
    # the cold set's S01R -> RR: the whole floor (0.000602 s) ruled the baseline out
    # against 0.000344 s; the receipts (each receiver's piece through its NIC, then the
    # all-gather's shares) alone do too, and the whole floor is not found
    tensors = _tensors("S01R", "RR", (8192, 8192), "cross")
    memo = Builds()
    best = _best_plan(tensors, H100, Strategy.BROADCAST, memo)
    assert memo.receipts(tensors, H100) > best.estimate()
    assert not memo._floors  # neither baseline's whole floor was needed


def test_above_its_limit_it_counts_nothing_and_the_whole_floor_decides(monkeypatch):
    # S10R -> RR at 1,024 devices asks 1,048,576 receivers: counted one by one they cost
    # more than the request; above RECEIPTS_UP_TO the floor is 0.0 and the whole floor
    # (as before the receipts) rules the baseline out, the answer unchanged
    tensors = _tensors("S01R", "RR", (8192, 8192), "cross")
    expected = _best_plan(tensors, H100, Strategy.BROADCAST).estimate()
    s = cut_slices(tensors, H100, Strategy.ALLGATHER)
    entries = sum(len(cell.needers) for _, cell in s.work.general)
    monkeypatch.setattr(gather_floor, "RECEIPTS_UP_TO", entries - 1)
    assert receipts_floor(s.work, s.itemsizes, H100) == 0.0
    memo = Builds()
    assert _best_plan(tensors, H100, Strategy.BROADCAST, memo).estimate() == expected
    assert memo._floors  # the whole floor was found instead
    monkeypatch.setattr(gather_floor, "RECEIPTS_UP_TO", entries)
    assert receipts_floor(s.work, s.itemsizes, H100) > 0.0


@pytest.mark.parametrize("src,dst,shape,how", CASES + MORE)
def test_the_plan_is_the_one_with_every_baseline_built(src, dst, shape, how):
    tensors = _tensors(src, dst, shape, how)
    fast = _best_plan(tensors, H100, Strategy.BROADCAST, Builds())
    slow = _best_plan(tensors, H100, Strategy.BROADCAST, _Never())
    assert fast.tasks == slow.tasks and fast.estimate() == slow.estimate()


@pytest.mark.parametrize("src,dst,shape,how",
                         [c for c in CASES + MORE if "+" not in c[0]])
def test_each_receivers_bytes_in_are_the_built_plans(src, dst, shape, how):
    # a plain source's all-gather plan takes in nothing but these receipts: each
    # (device, step)'s bytes in are the model's own of the built plan, and no other
    # load counted is above the plan's
    tensors = _tensors(src, dst, shape, how)
    s = cut_slices(tensors, H100, Strategy.ALLGATHER)
    counted = receipts(s.work, s.itemsizes, H100)
    tasks, _ = plan_tasks(tensors, H100, Strategy.ALLGATHER, fan_out=False)
    built = reduction_loads(tasks, H100)
    for key, b in counted.items():
        assert b <= built.get(key, 0.0) * (1 + 1e-12), key
    general = {r for _, cell in s.work.general for r in cell.needers - cell.holders}
    for key, b in built.items():
        if key[0] == DEV_IN and key[1][0] in general and not _sent_only(s.work, key[1][0]):
            assert counted.get(key, 0.0) == pytest.approx(b, rel=1e-12), key


def _sent_only(work, device):
    """Whether ``device`` also receives a point-to-point row (not counted here)."""
    return device in set(work.point_to_point().recv)


@pytest.mark.parametrize("src,dst,shape,how", CASES + MORE)
def test_a_baseline_plan_is_never_ruled_out_by_its_own_time(src, dst, shape, how):
    tensors = _tensors(src, dst, shape, how)
    gathered = _best_plan(tensors, H100, Strategy.ALLGATHER).estimate()
    memo = Builds()
    above = gathered * (1 + 1e-9)  # a plan this fast exists: no floor may reach it
    assert not memo.beaten(tensors, H100, Strategy.ALLGATHER, above)

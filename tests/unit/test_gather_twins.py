"""The ``allgather`` baseline not planned where its plans are ``send_recv``'s (issue 62,
round ten, :mod:`reshard.planner.passes.gather_twins`): the cell test against both
cell planners run side by side (random cells and loads), each request's baseline plans
built anyway where the test skips them (equal, task for task, to ``send_recv``'s, and
never faster than the plan kept), and every plan the same with the skip and without."""

from __future__ import annotations

import random

import pytest

import reshard.planner.plan as planner
from reshard import Cluster, Layout
from reshard.planner.builds import Builds
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.cell_tasks import plan_allgather, plan_send_recv
from reshard.planner.cells.decompose import Cell
from reshard.planner.passes.gather_twins import cell_as_sends
from reshard.planner.plan import _best_plan, planned_tensors
from reshard.planner.values.strategy import Strategy
from tests.unit._four_by_eight import meshes


def _loads(cluster: Cluster, rng: random.Random) -> Loads:
    """Loads with random whole-byte sends already charged (the planners' choices read
    them)."""
    loads = Loads(cluster)
    devices = list(cluster.devices)
    for _ in range(rng.randrange(0, 12)):
        a, b = rng.sample(devices, 2)
        loads.charge(a, (b,), rng.randrange(1, 1 << 20))
    return loads


def _state(loads: Loads) -> tuple[object, ...]:
    return tuple(dict(x) if isinstance(x, dict) else list(x) for x in
                 (loads.dev_out, loads.dev_in, loads.nic_out, loads.nic_in))


def _cell(cluster: Cluster, rng: random.Random) -> Cell:
    devices = list(cluster.devices)
    rows = rng.randrange(1, 9) * 64
    box = ((0, rows), (0, 64))
    holders = frozenset(rng.sample(devices, rng.choice([1, 1, 2, 3])))
    needers = frozenset(rng.sample(devices, rng.choice([1, 2, 3, 4, 6])))
    return Cell(box, holders, needers)


@pytest.mark.parametrize("preset,hosts", [("dgx-h100", 4), ("aws-p3.8xlarge", 4),
                                          ("dgx-h100", 2)])
def test_a_cell_that_passes_is_planned_alike(preset, hosts):
    cluster = Cluster.preset(preset, hosts)
    rng = random.Random(f"{preset}/{hosts}")  # a fixed seed (str hashes vary by run)
    seen = {True: 0, False: 0, "differs": 0}
    for _ in range(3000):
        cell = _cell(cluster, rng)
        seed = rng.random()
        a, b = _loads(cluster, random.Random(seed)), _loads(cluster, random.Random(seed))
        sends = plan_send_recv(cell, 0, 2, a, 3)
        gathers = plan_allgather(cell, 0, 2, b, 3)
        same = cell_as_sends(cell.holders, cell.needers, a.host)
        seen[same] += 1
        if same:
            assert sends == gathers and _state(a) == _state(b), cell
        elif sends != gathers or _state(a) != _state(b):
            seen["differs"] += 1
    assert seen[True] > 100 and seen[False] > 100 and seen["differs"] > 100


def _tensors(src: str, dst: str, shape: tuple[int, ...], how: str):
    """The request's planned tensors and cluster, its meshes placed as ``how`` names
    (``tests.unit._four_by_eight.meshes``)."""
    a, b, cluster, dtype = meshes(how)
    tensors, _ = planned_tensors([(shape, dtype, Layout(a, src), Layout(b, dst))],
                                 cluster, None, None)
    return tensors, cluster


MOVES = [(s, d, shape, how)
         for s, d in [("RS0+P1", "RS1"), ("RR+P01", "S1R"), ("RR+P0", "S1R"),
                      ("S0R+P1", "S1S0"), ("RS1+P0", "RS1"), ("RR+P0", "S0R"),
                      ("S1R+P0", "RR"), ("RS0", "RS1"), ("S0R", "RR")]
         for shape, how in [((2048, 2048), "cross"), ((1000, 2056), "cross"),
                            ((1024, 520), "same"), ((2048, 1000), "overlap"),
                            ((512, 768), "p3")]] + [("RR+P1", "RR", (2048, 2048), "same")]
"""Partial sums (whose ``allgather`` plans are often ``send_recv``'s) and plain
sources, even and uneven shapes, across meshes, within one, overlapping, another
cluster; the last, one where the ``allgather`` baseline is kept."""


@pytest.mark.parametrize("src,dst,shape,how", MOVES)
def test_a_skipped_baseline_could_not_have_been_kept(src, dst, shape, how, monkeypatch):
    tensors, cluster = _tensors(src, dst, shape, how)
    memo = Builds()
    got = _best_plan(tensors, cluster, Strategy.BROADCAST, memo)
    monkeypatch.setattr(Builds, "gathers_as_sends", lambda self, t, c: False)
    every = _best_plan(tensors, cluster, Strategy.BROADCAST, Builds())
    monkeypatch.undo()
    assert got.tasks == every.tasks and got.estimate() == every.estimate()
    if not memo.gathers_as_sends(tensors, cluster):
        return
    # built anyway: the allgather baseline is the send_recv baseline, task for task,
    # and no faster than the plan kept
    fresh = Builds()
    gathered = _best_plan(tensors, cluster, Strategy.ALLGATHER, fresh)
    sent = _best_plan(tensors, cluster, Strategy.SEND_RECV, fresh)
    assert gathered.tasks == sent.tasks
    assert not gathered.estimate() < got.estimate()
    for fine in (False, True):
        g = fresh(tensors, cluster, Strategy.ALLGATHER, fan_out=False, fine=fine)
        s = fresh(tensors, cluster, Strategy.SEND_RECV, fan_out=False, fine=fine)
        assert g is not None and s is not None and g[0] == s[0]


def test_both_answers_occur():
    answers = set()
    for src, dst, shape, how in MOVES:
        tensors, cluster = _tensors(src, dst, shape, how)
        answers.add(Builds().gathers_as_sends(tensors, cluster))
    assert answers == {True, False}


def test_the_skip_is_asked_only_after_send_recv(monkeypatch):
    """The proof leans on ``send_recv`` weighed first in the same call: ``allgather``
    is never planned where the test holds, and ``send_recv`` always is or is floored."""
    tensors, cluster = _tensors("RS0+P1", "RS1", (2048, 2048), "cross")
    planned: list[Strategy] = []
    best_plan = _best_plan

    def recorded(tensors, cluster, strat, builds=None):  # type: ignore[no-untyped-def]
        planned.append(strat)
        return best_plan(tensors, cluster, strat, builds)

    monkeypatch.setattr(planner, "_best_plan", recorded)
    memo = Builds()
    best_plan(tensors, cluster, Strategy.BROADCAST, memo)
    assert memo.gathers_as_sends(tensors, cluster)
    assert Strategy.ALLGATHER not in planned and Strategy.SEND_RECV in planned


def test_a_baseline_the_test_does_not_skip_is_still_kept():
    """Within one mesh, RR+P1 -> RR keeps the ``allgather`` baseline's plan (its cells
    fail the test, so it is planned)."""
    tensors, cluster = _tensors("RR+P1", "RR", (2048, 2048), "same")
    memo = Builds()
    got = _best_plan(tensors, cluster, Strategy.BROADCAST, memo)
    assert not memo.gathers_as_sends(tensors, cluster)
    assert got.tasks == _best_plan(tensors, cluster, Strategy.ALLGATHER, Builds()).tasks

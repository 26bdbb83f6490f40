"""The ``send_recv`` baseline's host floor (issue 62, round eleven,
:mod:`reshard.planner.passes.send_floor`): never above a ``send_recv`` plan's model time
(the first plan of each cut, its tasks one at a time, the baseline's search's result),
its bytes as a loop over every cell counts them, and every plan the same with the floor
and without it (where it rules a baseline or ``point-to-point`` out, neither could have
been kept)."""

from __future__ import annotations

import pytest

import reshard.planner.builds as builds_module
from reshard import Layout
from reshard.planner.builds import Builds
from reshard.planner.cells.decompose import CellTable
from reshard.planner.ir import ReshardPlan
from reshard.planner.passes.send_floor import bytes_out, send_floor
from reshard.planner.plan import _best_plan, planned_tensors
from reshard.planner.schedule.order import one_at_a_time
from reshard.planner.values.strategy import Strategy
from tests.unit._four_by_eight import meshes


def _tensors(moves: list[tuple[str, str]], shape: tuple[int, ...], how: str):
    """The request's planned tensors and cluster, its meshes placed as ``how`` names
    (``tests.unit._four_by_eight.meshes``)."""
    a, b, cluster, dtype = meshes(how)
    tensors, _ = planned_tensors([(shape, dtype, Layout(a, s), Layout(b, d)) for s, d in moves],
                                 cluster, None, None)
    return tensors, cluster


CASES = [([(s, d)], shape, how)
         for s, d in [("S0R", "RR"), ("S1R", "RS0"), ("RS0", "S1R"), ("S01R", "RR"),
                      ("RR", "S0R"), ("S0S1", "S1S0"), ("RR+P0", "S0R"), ("S0R+P1", "RR"),
                      ("RS1+P0", "RS1")]
         for shape, how in [((2048, 2048), "cross"), ((1000, 2056), "cross"),
                            ((1024, 520), "same"), ((2048, 1000), "overlap"),
                            ((512, 768), "p3"), ((1024, 1024), "spread")]] + \
    [([("S0R", "RR"), ("RR+P0", "S1R")], (1024, 1024), "cross"),
     ([("S0R", "RR"), ("RS1", "S0R")], (1000, 1000), "overlap")]
"""Replicated sources (the floor's case), sharded ones, partial sums (their reduced
pieces' roots the holders),
even and uneven shapes, across meshes, within one, overlapping, a source whose rows
span two hosts (holders on two hosts: not counted), another cluster, two tensors."""


def _floor(memo: Builds, tensors, cluster, fine: bool) -> float:
    cut = memo.cut(tensors, cluster, False, fine)
    return send_floor(zip(cut.cells, [t.itemsize for t in tensors]), cluster)


@pytest.mark.parametrize("moves,shape,how", CASES)
def test_the_floor_is_below_every_send_recv_plan(moves, shape, how):
    tensors, cluster = _tensors(moves, shape, how)
    memo = Builds()
    for fine in (False, True):
        floor = _floor(memo, tensors, cluster, fine)
        for fan_out in (False, True):
            got = memo(tensors, cluster, Strategy.SEND_RECV, fan_out=fan_out, fine=fine)
            assert got is not None
            for tasks in (got[0], one_at_a_time(got[0])):
                plan = ReshardPlan(tensors, tasks, Strategy.SEND_RECV, cluster)
                assert floor <= plan.estimate()
    # the search's result: from either cut (a partial sum's finer cut reduces otherwise)
    best = _best_plan(tensors, cluster, Strategy.SEND_RECV, Builds())
    assert min(_floor(memo, tensors, cluster, f) for f in (False, True)) <= best.estimate()


def test_the_floor_is_tight_where_a_host_sends_every_copy():
    """S0R -> RR across meshes: each row block's eight holders share a host, and the 24
    devices of the other hosts each take a copy out of it; the ``send_recv`` plan
    comes within 2% of the floor, far above the broadcast plan kept."""
    tensors, cluster = _tensors([("S0R", "RR")], (2048, 2048), "cross")
    memo = Builds()
    floor = _floor(memo, tensors, cluster, False)
    sends = _best_plan(tensors, cluster, Strategy.SEND_RECV, Builds()).estimate()
    kept = _best_plan(tensors, cluster, Strategy.BROADCAST, Builds()).estimate()
    assert 0.98 * sends <= floor <= sends and floor > 2 * kept
    assert memo.floor(tensors, cluster, Strategy.SEND_RECV) == floor


def _bytes_by_loop(cells_of, host) -> dict[frozenset[int], float]:
    out: dict[frozenset[int], float] = {}
    for cells, itemsize in cells_of:
        each = cells.cells() if isinstance(cells, CellTable) else cells
        for cell in each:
            hosts = frozenset(host(d) for d in cell.holders)
            for d in cell.needers:
                if host(d) not in hosts and cell.size:
                    out[hosts] = out.get(hosts, 0.0) + cell.size * itemsize
    return out


@pytest.mark.parametrize("moves,shape,how", CASES)
def test_the_bytes_are_every_cells(moves, shape, how):
    tensors, cluster = _tensors(moves, shape, how)
    memo = Builds()
    for fine in (False, True):
        cut = memo.cut(tensors, cluster, False, fine)
        cells = list(zip(cut.cells, [t.itemsize for t in tensors]))
        assert bytes_out(cells, cluster.host_of) == _bytes_by_loop(cells, cluster.host_of)


@pytest.mark.parametrize("moves,shape,how", CASES)
def test_every_plan_is_the_same_without_the_floor(moves, shape, how, monkeypatch):
    tensors, cluster = _tensors(moves, shape, how)
    got = _best_plan(tensors, cluster, Strategy.BROADCAST, Builds())
    monkeypatch.setattr(builds_module, "send_floor", lambda cells, cluster: 0.0)
    every = _best_plan(tensors, cluster, Strategy.BROADCAST, Builds())
    assert got.tasks == every.tasks and got.estimate() == every.estimate()


def test_the_floor_rules_something_out(monkeypatch):
    """Across the cases, the floor rules ``send_recv`` (or ``point-to-point``) out where
    the slices' floor alone did not: fewer ``send_recv`` plans are built with it."""
    built = {"with": 0, "without": 0}
    columns = Builds.columns

    def counted(self, tensors, cluster, strat, *args, **kwargs):  # type: ignore[no-untyped-def]
        if strat is Strategy.SEND_RECV:
            built[key] += 1
        return columns(self, tensors, cluster, strat, *args, **kwargs)

    monkeypatch.setattr(Builds, "columns", counted)
    for key in ("with", "without"):
        if key == "without":
            monkeypatch.setattr(builds_module, "send_floor", lambda cells, cluster: 0.0)
        for moves, shape, how in CASES:
            tensors, cluster = _tensors(moves, shape, how)
            _best_plan(tensors, cluster, Strategy.BROADCAST, Builds())
    assert built["with"] < built["without"]


def test_the_floor_is_send_recv_s_alone():
    """An all-gather sends a host one copy, not one per device: on S0R -> RR the send
    floor is above the ``allgather`` plan, and ``allgather``'s floor stays below it."""
    tensors, cluster = _tensors([("S0R", "RR")], (2048, 2048), "cross")
    memo = Builds()
    gathered = _best_plan(tensors, cluster, Strategy.ALLGATHER, Builds()).estimate()
    assert _floor(memo, tensors, cluster, False) > gathered
    assert memo.floor(tensors, cluster, Strategy.ALLGATHER) <= gathered

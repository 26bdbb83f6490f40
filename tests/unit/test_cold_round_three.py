"""Cold costs, round three (issue 62, 4x8): what skips work keeps the planner's plan.

A baseline is planned only where its floor is below the best plan so far, a baseline
planned before it included: the same plan as every baseline built and compared (any
layouts, plain and partial); and an estimate frees its call's memo before the cyclic
collector resumes, so the collector has nothing of it left to walk; a fine cut whose
reductions come out as the coarse cut's takes its cells from it, the cells it would cut.
"""

from __future__ import annotations

import gc

from hypothesis import given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.core import gcpause
from reshard.planner.builds import Builds
from reshard.planner.cells.decompose import Cell, CellTable
from reshard.planner.cuts import cut_cells
from reshard.planner.plan import _best_plan, estimate_tensors, planned_tensors
from reshard.planner.values.strategy import Strategy

from ..common import problems
from .test_cold_costs import partial_moves

CLUSTERS = (Cluster.preset("dgx-h100", 4, 4),
            Cluster.regular(4, 3, nic_bandwidth=1e9, intra_bandwidth=4e9, latency=2e-5),
            Cluster.regular(3, 2, nic_bandwidth=4e9, intra_bandwidth=1e9, latency=1e-6))


class _Unpruned(Builds):
    """Every baseline built and simulated: no floor rules one out."""

    def beaten(self, *args: object, **kwargs: object) -> bool:
        return False


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.data(), st.sampled_from(CLUSTERS))
def test_a_baseline_ruled_out_by_the_best_so_far_changes_no_plan(data, cluster):
    shape, dtype, src, dst = data.draw(problems(cluster.devices, max_ndim=2, max_size=6))
    shape = tuple(d * 1024 for d in shape)
    tensors, _ = planned_tensors([(shape, dtype, src, dst)], cluster, None, None)
    fast = _best_plan(tensors, cluster, Strategy.BROADCAST)
    slow = _best_plan(tensors, cluster, Strategy.BROADCAST, _Unpruned())
    assert fast.tasks == slow.tasks and fast.estimate() == slow.estimate()


def test_an_estimate_frees_its_memo_before_the_collector_resumes(monkeypatch):
    cluster = Cluster.preset("dgx-h100", 8)
    a, b = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))
    request = ((8192, 8192), "bfloat16", Layout(a, "S0R+P1"), Layout(b, "RR"))
    tensors, planned_on = planned_tensors([request], cluster, None, None)
    expected = reshard.plan(*request, cluster=cluster).estimate()
    live: list[int] = []

    class Watched:
        """The collector, counting what it tracks when it is enabled again."""

        isenabled, disable = staticmethod(gc.isenabled), staticmethod(gc.disable)

        @staticmethod
        def enable() -> None:
            live.append(len(gc.get_objects()))
            gc.enable()

    monkeypatch.setattr(gcpause, "gc", Watched)
    gc.collect()
    before = len(gc.get_objects())
    assert estimate_tensors(tensors, planned_on, Strategy.BROADCAST) == expected
    # the call's plans, tasks and routes (tens of thousands of objects) died first
    assert live and live[-1] - before < 1000, (before, live)


def _listed(cells: list[Cell] | CellTable) -> list[Cell]:
    """A tensor's cells as a list (a partial source's may be a table)."""
    return cells.cells() if isinstance(cells, CellTable) else list(cells)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(partial_moves(), st.booleans())
def test_a_fine_cut_like_the_coarse_one_is_the_cut_made_afresh(move, fuse):
    shape, dtype, src, dst, cluster = move
    tensors, _ = planned_tensors([(shape, dtype, src, dst)], cluster, None, None)
    coarse = cut_cells(tensors, cluster, fuse, False)
    fresh = cut_cells(tensors, cluster, fuse, True)
    reused = cut_cells(tensors, cluster, fuse, True, like=coarse)
    assert reused.reduces == fresh.reduces
    assert [type(c) for c in reused.cells] == [type(c) for c in fresh.cells]
    assert [_listed(c) for c in reused.cells] == [_listed(c) for c in fresh.cells]
    assert [list(a) for a in reused.after] == [list(a) for a in fresh.after]

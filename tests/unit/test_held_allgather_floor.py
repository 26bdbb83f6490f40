"""The ``allgather`` baseline's floor counts the receipts of cells of several holders
(``floors._Flows._gathered_held``, issue 62 round fifteen): each receiver host's pieces
through its receivers' NICs and links, then the all-gather's shares at the step after,
as :func:`~reshard.planner.cells.cell_tasks.plan_allgather` plans them (no send out:
which holder sends is a choice). Before, such cells counted nothing, so a replicated
source's all-gather baseline (S0R -> RR: 1.8x the plan to beat) was always built and
simulated. Checked against the model's own loads of the built all-gather plan (every
key counted is no more than the plan puts there), against the searched plan (the floor
is below it), and by planning with every baseline built (the same plan)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.builds import Builds
from reshard.planner.cuts import cut_slices
from reshard.planner.plan import _best_plan, plan_tasks, planned_tensors
from reshard.planner.schedule.floors import _counted, baseline_floor, reduction_loads
from reshard.planner.values.strategy import Strategy

H100 = Cluster.preset("dgx-h100", 8)
SMALL = Cluster.regular(4, 3, nic_bandwidth=1e9, intra_bandwidth=4e9, latency=2e-5)


def _tensors(src: str, dst: str, shape: tuple[int, ...], how: str, cluster: Cluster = H100,
             dims: tuple[int, int] = (4, 8)):
    """One tensor from ``src`` to ``dst``: ``how`` ``cross`` (disjoint meshes), ``same``
    (one mesh) or ``overlap`` (the destination shifted by half a mesh)."""
    n = dims[0] * dims[1]
    shift = {"cross": n, "same": 0, "overlap": n // 2}[how]
    a = DeviceMesh(dims, range(n))
    b = DeviceMesh(dims, range(shift, shift + n))
    tensors, _ = planned_tensors([(shape, "bfloat16", Layout(a, src), Layout(b, dst))],
                                 cluster, None, None)
    return tensors


CASES = [("S0R", "RR", (8192, 8192), "cross"), ("RR", "RR", (2048, 2048), "cross"),
         ("RS1", "RR", (16384, 4096), "cross"), ("S1R", "RS0", (2048, 2048), "cross"),
         ("S0R", "S0R", (8192, 8192), "cross"), ("RS0", "S1R", (1000, 2050), "cross"),
         ("S0R", "RR", (1030, 777), "overlap"), ("RR", "S01R", (4096, 2048), "overlap"),
         ("S1R", "RR", (2048, 4100), "same"), ("RS0", "RS10", (999, 4097), "same"),
         ("RR", "S0S1", (4096, 4096), "overlap"), ("S0R", "RS1", (3, 4096), "cross")]
"""Sources replicated over an axis (each cell of several holders), to replicated,
sharded and mixed destinations; disjoint, overlapping and the same meshes; even and
uneven shapes (a box too small to split over a host's receivers included)."""


@pytest.mark.parametrize("src,dst,shape,how", CASES)
def test_every_load_counted_is_at_most_the_built_plans(src, dst, shape, how):
    tensors = _tensors(src, dst, shape, how)
    s = cut_slices(tensors, H100, Strategy.ALLGATHER)
    counted: defaultdict = defaultdict(float)
    _counted(s.work, s.itemsizes, H100, Strategy.ALLGATHER, False).add_to(counted)
    tasks, _ = plan_tasks(tensors, H100, Strategy.ALLGATHER, fan_out=False)
    built = reduction_loads(tasks, H100)  # the model's bytes of every task, by step
    assert counted  # the receipts are counted
    for key, b in counted.items():
        assert b <= built.get(key, 0.0) * (1 + 1e-12), key


@pytest.mark.parametrize("src,dst,shape,how", CASES)
@pytest.mark.parametrize("cluster", [H100, SMALL], ids=["h100", "small"])
def test_the_floor_is_below_the_searched_allgather_plan(src, dst, shape, how, cluster):
    dims = (4, 8) if cluster is H100 else (2, 3)
    tensors = _tensors(src, dst, shape, how, cluster, dims)
    s = cut_slices(tensors, cluster, Strategy.ALLGATHER)
    floor = baseline_floor(s.work, s.reduces, s.itemsizes, cluster, Strategy.ALLGATHER)
    assert floor <= _best_plan(tensors, cluster, Strategy.ALLGATHER).estimate()


def test_a_replicated_sources_allgather_floor_is_no_longer_zero():
    # S0R -> RR 8192 x 8192 (the cold set's): every cell has 8 holders; its floor was
    # 0.0, the plan to beat 0.000344 s, the all-gather plan 0.000623 s
    tensors = _tensors("S0R", "RR", (8192, 8192), "cross")
    memo = Builds()
    best = _best_plan(tensors, H100, Strategy.BROADCAST, memo)
    floor = memo.floor(tensors, H100, Strategy.ALLGATHER)
    assert best.estimate() < floor <= _best_plan(tensors, H100,
                                                 Strategy.ALLGATHER).estimate()


class _Never(Builds):
    """A memo whose baselines are never ruled out: every one is built and searched."""

    def beaten(self, tensors, cluster, baseline, seconds):  # type: ignore[no-untyped-def]
        return False


# test_receipts_floor.test_the_plan_is_the_one_with_every_baseline_built runs CASES too

"""The fine cut's least tasks counted from its cells (reshard.planner.cuts.least_tasks)
equal the slices' own count (Slices.least_tasks) for every strategy and both cuts, a
cell that broadcast splits for balance counted a piece at a time; and the planning
call that reads it (Builds.columns of the fine cut under a limit: the ``finer`` pass)
plans exactly as it did when the slices were cut first."""

from __future__ import annotations

from unittest import mock

import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner import builds as builds_module
from reshard.planner import cuts
from reshard.planner import plan as planner
from reshard.planner.passes.stages import COMPARE_UP_TO
from reshard.planner.plan import make_tensor_spec
from reshard.planner.values.strategy import Strategy

CLUSTER = Cluster.preset("dgx-h100", 8)
A, B = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))
REQUESTS = [((8192, 8192), "S0R+P1", "RS0"), ((2048, 2048), "RR+P1", "RS1"),
            ((16384, 4096), "S1R+P0", "S0S1"), ((2048, 2048), "RR+P01", "S0R"),
            ((8192, 8192), "S0R", "RS1"), ((2048, 2048), "RS1+P0", "RS10")]


def _tensors(shape, src, dst):
    return (make_tensor_spec(shape, "bfloat16", Layout(A, src), Layout(B, dst), CLUSTER),)


@pytest.mark.parametrize("shape,src,dst", REQUESTS)
def test_counted_from_cells_equals_the_slices_count(shape, src, dst):
    tensors = _tensors(shape, src, dst)
    for fine in (False, True):
        cut = cuts.cut_cells(tensors, CLUSTER, fine=fine)
        for strat in Strategy:
            want = cuts.cut_slices(tensors, CLUSTER, strat, fine=fine, cut=cut).least_tasks()
            got = cuts.least_tasks(cut, CLUSTER, strat, [t.itemsize for t in tensors], fine)
            assert got == want, (strat, fine)


def test_the_cases_split_cells_for_balance():
    """Some broadcast cut here splits cells (a count that ignored the pieces fails
    the test above), and some request's fine cut is over the finer pass's limit."""
    split = over = 0
    for shape, src, dst in REQUESTS:
        tensors = _tensors(shape, src, dst)
        for fine in (False, True):
            cut = cuts.cut_cells(tensors, CLUSTER, fine=fine)
            whole = cuts.least_tasks(cut, CLUSTER, Strategy.ALLGATHER, [2], fine)
            pieces = cuts.least_tasks(cut, CLUSTER, Strategy.BROADCAST, [2], fine)
            assert whole is not None and pieces is not None
            split += pieces > whole
            over += fine and pieces > COMPARE_UP_TO
    assert split and over


@pytest.mark.parametrize("shape,src,dst", REQUESTS[:3])
def test_plans_equal_those_with_the_slices_cut_first(shape, src, dst):
    """The broadcast plan (its search's finer pass asks the fine cut under a limit)
    with the count from cells, and with it never read (the slices cut, then counted:
    the path before it); the count says 'over' on at least one of these."""
    tensors = _tensors(shape, src, dst)
    seen = []
    over = builds_module.Builds.over

    def spy(self, *args):
        seen.append(over(self, *args))
        return seen[-1]

    with mock.patch.object(builds_module.Builds, "over", spy):
        fast = planner.plan_tensors(tensors, CLUSTER, Strategy.BROADCAST, None)
    with mock.patch.object(builds_module.Builds, "over", lambda *_: False):
        slow = planner.plan_tensors(tensors, CLUSTER, Strategy.BROADCAST, None)
    assert fast.tasks == slow.tasks and fast.estimate() == slow.estimate()
    if (shape, src, dst) == REQUESTS[0]:  # asked, and over the limit
        assert any(seen)

"""Whether the fine cut's slices are the coarse cut's, shown from the two cuts
(reshard.planner.cuts.same_slices): never where their signatures differ, on every case
here where they are equal, and the planner (Builds._fine_as_coarse, which no longer
cuts the fine slices where the cuts show it) plans as it did."""

from __future__ import annotations

from unittest import mock

import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner import cuts
from reshard.planner import plan as planner
from reshard.planner.plan import make_tensor_spec
from reshard.planner.values.strategy import Strategy

CLUSTER = Cluster.preset("dgx-h100", 8)
A, B = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))
REQUESTS = [((8192, 8192), "S0R+P1", "RS0"), ((2048, 2048), "RR+P1", "RS1"),
            ((16384, 4096), "RR+P1", "S0S1"), ((2048, 2048), "RR+P01", "S0R"),
            ((8192, 8192), "S1R+P0", "S01R"), ((2048, 2048), "RS1+P0", "RS10"),
            ((2048, 2048), "S0R", "RS1")]


def _tensors(shape, src, dst):
    return (make_tensor_spec(shape, "bfloat16", Layout(A, src), Layout(B, dst), CLUSTER),)


def _signed(tensors, strat, cut, fine):
    s = cuts.cut_slices(tensors, CLUSTER, strat, fine=fine, cut=cut)
    return s.reduces, s.work.signature()


def test_shown_exactly_where_the_signatures_are_equal():
    answers = set()
    for shape, src, dst in REQUESTS:
        tensors = _tensors(shape, src, dst)
        coarse = cuts.cut_cells(tensors, CLUSTER)
        fine = cuts.cut_cells(tensors, CLUSTER, fine=True, like=coarse)
        for strat in Strategy:
            equal = _signed(tensors, strat, coarse, False) == _signed(tensors, strat, fine, True)
            shown = cuts.same_slices(coarse, fine, CLUSTER, strat, [t.itemsize for t in tensors])
            assert shown == equal, (shape, src, dst, strat)
            answers.add((strat is Strategy.BROADCAST, shown))
    # broadcast (cut for balance) and the others, each both ways: a test that
    # ignored the pieces, or the reductions, fails above
    assert answers == {(True, True), (True, False), (False, True), (False, False)}


@pytest.mark.parametrize("shape,src,dst", REQUESTS[:3])
def test_plans_equal_those_with_the_fine_slices_cut(shape, src, dst):
    tensors = _tensors(shape, src, dst)
    fast = planner.plan_tensors(tensors, CLUSTER, Strategy.BROADCAST, None)
    with mock.patch.object(planner, "same_slices", lambda *_: False):
        slow = planner.plan_tensors(tensors, CLUSTER, Strategy.BROADCAST, None)
    assert fast.tasks == slow.tasks and fast.estimate() == slow.estimate()

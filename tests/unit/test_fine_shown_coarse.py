"""Builds.columns asks no Builds.over where the two cuts already show the fine slices
to be the coarse ones (Builds._shown_coarse): the ``finer`` pass then gets the coarse
plan, which it never keeps, where it got None before (the fine cut over its limit) or
the same coarse plan. Compared with the path it skips (the shortcut patched off) on
plain and partial sources, uneven shapes, overlapping meshes and limits on both
sides of the plans' sizes, and on whole plans (a 2048 x 2048 S0R -> S0R, whose fine
plan the search keeps, included)."""

from __future__ import annotations

from unittest import mock

import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner import builds as builds_module
from reshard.planner import plan as planner
from reshard.planner.builds import Builds
from reshard.planner.plan import make_tensor_spec
from reshard.planner.values.strategy import Strategy

CLUSTER = Cluster.preset("dgx-h100", 8)
A, B = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))
C = DeviceMesh((2, 8), range(16, 32))  # overlaps A's last two hosts
REQUESTS = [((2048, 2048), "S0R", "S0R", B), ((8192, 8192), "S1R", "RS0", B),
            ((2048, 2048), "RS1", "RR", B), ((16384, 4096), "RS01", "S0R", B),
            ((2000, 3000), "S0R", "RS1", B), ((2048, 2048), "RR+P1", "RS1", B),
            ((8192, 8192), "S0R+P1", "RS0", B), ((1000, 2048), "RS1+P0", "RS10", B),
            ((4096, 4096), "S01R", "RR", C), ((2048, 2048), "RR+P0", "S1R", C)]
LIMITS = (8, 64, 256, 1024)


def _tensors(shape, src, dst, mesh):
    return (make_tensor_spec(shape, "bfloat16", Layout(A, src), Layout(mesh, dst), CLUSTER),)


def _unshown():
    return mock.patch.object(Builds, "_shown_coarse", lambda *_: False)


def _candidate(builds, tensors, strat, limit):
    """What ``finer`` proposes from this build: the fine tasks, or None (as its rule)."""
    first = builds.whole(tensors, CLUSTER, strat, fan_out=False)[0]
    got = builds(tensors, CLUSTER, strat, fan_out=False, fine=True, limit=limit)
    return None if got is None or len(got[0]) > limit or got[0] == first else got[0]


@pytest.mark.parametrize("strat", list(Strategy))
def test_finer_proposes_as_without_the_shortcut(strat):
    shown = taken = 0
    for shape, src, dst, mesh in REQUESTS:
        tensors = _tensors(shape, src, dst, mesh)
        for limit in LIMITS:
            fast = _candidate(Builds(), tensors, strat, limit)
            with _unshown():
                slow = _candidate(Builds(), tensors, strat, limit)
            assert fast == slow, (shape, src, dst, strat, limit)
            builds = Builds()
            builds.whole(tensors, CLUSTER, strat, fan_out=False)
            shown += builds._shown_coarse(tensors, CLUSTER, strat, False)
            taken += fast is not None
    assert shown  # the shortcut is met
    if strat is Strategy.BROADCAST:
        assert taken  # and fine plans are proposed


def test_over_is_not_asked_where_the_cuts_show_the_coarse_slices():
    tensors = _tensors((8192, 8192), "S0R", "RS1", B)  # a plain source: cuts equal
    builds = Builds()
    builds.whole(tensors, CLUSTER, Strategy.SEND_RECV, fan_out=False)
    assert builds._shown_coarse(tensors, CLUSTER, Strategy.SEND_RECV, False)
    with mock.patch.object(Builds, "over", side_effect=AssertionError("asked")):
        got = builds(tensors, CLUSTER, Strategy.SEND_RECV, fan_out=False, fine=True, limit=8)
    first = builds.whole(tensors, CLUSTER, Strategy.SEND_RECV, fan_out=False)
    assert got == first  # the coarse plan (over the limit: finer keeps nothing)


def test_shown_once_per_strategy():
    tensors = _tensors((2048, 2048), "RR+P1", "RS1", B)
    builds = Builds()
    for strat in Strategy:
        assert builds._shown_coarse(tensors, CLUSTER, strat, False) == \
            builds_module.same_slices(builds.cut(tensors, CLUSTER, False, False),
                                builds.cut(tensors, CLUSTER, False, True), CLUSTER, strat,
                                [t.itemsize for t in tensors])
    assert {s for (tag, *_, s, _f) in builds._told if tag == "shown"} == set(Strategy)


@pytest.mark.parametrize("shape,src,dst,mesh", REQUESTS)
def test_plans_equal_those_without_the_shortcut(shape, src, dst, mesh):
    tensors = _tensors(shape, src, dst, mesh)
    fast = planner.plan_tensors(tensors, CLUSTER, Strategy.BROADCAST, None)
    with _unshown():
        slow = planner.plan_tensors(tensors, CLUSTER, Strategy.BROADCAST, None)
    assert fast.tasks == slow.tasks and fast.estimate() == slow.estimate()

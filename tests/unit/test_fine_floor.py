"""``finer``'s floor (reshard.planner.passes.fine_floor): never above the model's
prediction of the fine plan it stands for (built and priced here, the brute-force
oracle) on plain sources over disjoint and overlapping meshes, uneven shapes, several
tensors and other clusters; not asked for partial sums or other strategies; and the
search plans exactly as without it (2048 x 2048 requests whose fine plan is kept
included), building no fine plan where it rules ``finer`` out."""

from __future__ import annotations

from unittest import mock

import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner import builds as builds_module
from reshard.planner import plan as planner
from reshard.planner.builds import Builds
from reshard.planner.ir import ReshardPlan
from reshard.planner.passes import stages
from reshard.planner.passes.fine_floor import MARGIN, fine_floor
from reshard.planner.plan import make_tensor_spec
from reshard.planner.values.strategy import Strategy

H100 = Cluster.preset("dgx-h100", 8)
A, B = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))
C = DeviceMesh((2, 8), range(16, 32))  # A's last two hosts
D = DeviceMesh((2, 4), range(8))  # A's first host alone
CASES = [  # (shape, src, dst, destination mesh), one bf16 tensor each
    ((8192, 8192), "S1R", "RS0", B), ((16384, 4096), "S01R", "S0R", B),
    ((2048, 2048), "S0R", "S0R", B), ((2048, 2048), "RS0", "RS0", B),
    ((2048, 2048), "S1R", "S1R", B), ((2048, 2048), "RS1", "RR", B),
    ((8192, 8192), "S0S1", "RR", B), ((2000, 3000), "S0R", "RS1", B),
    ((1000, 4100), "RS10", "S0R", B), ((4096, 4096), "S01R", "RR", C),
    ((4096, 2048), "RS1", "S0R", C), ((3000, 1000), "S0R", "RS0", D),
]


def _tensors(shape, src, dst, mesh, cluster=H100, dtype="bfloat16"):
    return (make_tensor_spec(shape, dtype, Layout(A, src), Layout(mesh, dst), cluster),)


def _floor(builds, tensors, cluster):
    cut = builds.cut(tensors, cluster, False, False)
    return fine_floor(zip(cut.cells, [t.itemsize for t in tensors]), cluster)


def _fine_time(builds, tensors, cluster):
    got = builds(tensors, cluster, Strategy.BROADCAST, fan_out=False, fine=True)
    return ReshardPlan(tensors, got[0], Strategy.BROADCAST, cluster).estimate()


def _check(tensors, cluster):
    builds = Builds()
    floor, fine = _floor(builds, tensors, cluster), _fine_time(builds, tensors, cluster)
    assert floor <= fine, (floor, fine)
    assert floor > 0 or all(t.dst.mesh is not B for t in tensors)  # B: hosts A holds none of
    return floor, fine


@pytest.mark.parametrize("shape,src,dst,mesh", CASES)
def test_the_floor_is_never_above_the_fine_plan(shape, src, dst, mesh):
    _check(_tensors(shape, src, dst, mesh), H100)


@pytest.mark.parametrize("preset", ["aws-p4d.24xlarge", "aws-p5.48xlarge", "dgx-a100", "aws-p3dn.24xlarge"])
def test_the_floor_on_other_clusters(preset):
    cluster = Cluster.preset(preset, 8)
    for shape, src, dst, mesh in CASES[::3]:
        _check(_tensors(shape, src, dst, mesh, cluster), cluster)


def test_the_floor_of_several_tensors_and_a_cast():
    tensors = (*_tensors((2048, 2048), "S0R", "RS0", B),
               *_tensors((1024, 4096), "RS1", "S0R", B, dtype="float32"))
    _check(tensors, H100)


def test_the_floor_is_tight_where_the_fine_plan_is_the_first_plans_chains_halved():
    floor, fine = _check(_tensors((8192, 8192), "S1R", "RS0", B), H100)
    assert fine * (1 - 2 * MARGIN) <= floor  # at the fine plan's own time


def test_no_floor_for_partial_sums_or_other_strategies():
    tensors = _tensors((2048, 2048), "RR+P1", "RS1", B)
    search = mock.Mock(fine_floor=lambda: 1.0, strategy=Strategy.BROADCAST, tensors=tensors)
    assert stages._finer_floor(search, None) == 0.0
    plain = _tensors((2048, 2048), "S0R", "RS1", B)
    for strat in (Strategy.SEND_RECV, Strategy.ALLGATHER):
        search = mock.Mock(fine_floor=lambda: 1.0, strategy=strat, tensors=plain)
        assert stages._finer_floor(search, None) == 0.0
    search = mock.Mock(fine_floor=None, strategy=Strategy.BROADCAST, tensors=plain)
    assert stages._finer_floor(search, None) == 0.0


def _no_floor():
    return mock.patch.object(planner, "fine_floor", lambda *_: 0.0)


@pytest.mark.parametrize("shape,src,dst,mesh", [
    *CASES, ((2048, 2048), "RR+P0", "RS0", B), ((8192, 8192), "S0R+P1", "S1R", B)])
def test_plans_equal_those_without_the_floor(shape, src, dst, mesh):
    tensors = _tensors(shape, src, dst, mesh)
    fast = planner.plan_tensors(tensors, H100, Strategy.BROADCAST, None)
    with _no_floor():
        slow = planner.plan_tensors(tensors, H100, Strategy.BROADCAST, None)
    assert fast.tasks == slow.tasks and fast.estimate() == slow.estimate()


def _fine_builds(tensors):
    asked = []
    real = Builds.columns

    def columns(self, *args, **kwargs):
        if kwargs.get("fine") or (len(args) > 5 and args[5]):
            asked.append(args)
        return real(self, *args, **kwargs)

    with mock.patch.object(Builds, "columns", columns):
        plan = planner.plan_tensors(tensors, H100, Strategy.BROADCAST, None)
    return plan, asked


def test_the_floor_skips_the_fine_build_and_keeps_a_faster_fine_plan():
    skipped, _ = _fine_builds(_tensors((8192, 8192), "S1R", "RS0", B))
    assert not _
    with _no_floor():
        built, asked = _fine_builds(_tensors((8192, 8192), "S1R", "RS0", B))
    assert asked and built.tasks == skipped.tasks
    kept, asked = _fine_builds(_tensors((2048, 2048), "S0R", "S0R", B))
    first = Builds().whole(_tensors((2048, 2048), "S0R", "S0R", B), H100,
                           Strategy.BROADCAST, fan_out=False)[0]
    assert asked and len(kept.tasks) > len(first)  # the fine plan, kept


def _floors_asked(tensors, limit):
    """The plan of ``tensors`` and how often ``fine_floor`` ran, plan.py's copy of the
    fine build's task limit set to ``limit``."""
    asked = []

    def spy(*args):
        asked.append(args)
        return fine_floor(*args)

    with mock.patch.object(planner, "fine_floor", spy), \
            mock.patch.object(planner, "COMPARE_UP_TO", limit):
        plan = planner.plan_tensors(tensors, H100, Strategy.BROADCAST, None)
    return plan, len(asked)


@pytest.mark.parametrize("shape,src,dst", [((8192, 8192), "S1R", "RS0"),
                                           ((2048, 2048), "S0R", "S0R")])
def test_no_floor_where_the_fine_build_is_refused_at_once(shape, src, dst):
    """Where the fine cut has more tasks at the least than the pass takes (S10R -> RR on
    1,024 devices), ``finer`` proposes nothing at the cost of counting them; the floor,
    a walk over every cell's receivers (0.3-0.8 s there), is not asked."""
    tensors = _tensors(shape, src, dst, B)
    plan, asked = _floors_asked(tensors, stages.COMPARE_UP_TO)
    assert asked == 1  # the pass can build: its floor is asked
    refused, asked = _floors_asked(tensors, 0)
    assert asked == 0 and refused.tasks == plan.tasks
    assert refused.estimate() == plan.estimate()


def test_the_fine_cut_is_counted_once_where_the_build_is_refused():
    """Where finer's build is refused for its task count, the floor's gate and the build
    ask the same question of the fine cut: it is counted once."""
    tensors = _tensors((8192, 8192), "S1R", "RS0", B)
    counted = []
    real = builds_module.least_tasks

    def spy(*args, **kwargs):
        counted.append(args)
        return real(*args, **kwargs)

    with mock.patch.object(builds_module, "least_tasks", spy), \
            mock.patch.object(planner, "COMPARE_UP_TO", 0), \
            mock.patch.object(stages, "COMPARE_UP_TO", 0):
        planner.plan_tensors(tensors, H100, Strategy.BROADCAST, None)
    assert len(counted) == 1

"""A device's share of a plan (:mod:`reshard.planner.share`) against the whole plan cut
(the oracle: ``plan_many`` then the device's tasks), and the plan digest computed from
the planner's columns against the one computed from the tasks
(:mod:`reshard.planner.values.digest`)."""

from __future__ import annotations

import dataclasses

import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.comm.program import WorkerProgram, programs, share_program
from reshard.planner.ir import ReshardPlan
from reshard.planner.passes.stages import ALTERNATIVES_UP_TO
from reshard.planner.plan import ordered_tasks, planned_tensors
from reshard.planner.share import PlanShare, plan_share
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Buffer, TaskKind

CL = Cluster.preset("dgx-h100", 16)
A = Layout(DeviceMesh((8, 8)), "S01R")
B = Layout(DeviceMesh((8, 8), devices=range(64, 128)), "RS10")
P = Layout(DeviceMesh((8, 8)), "S0R+P1")
A3 = Layout(DeviceMesh((8, 8)), "S0RS1")
B3 = Layout(DeviceMesh((8, 8), devices=range(64, 128)), "RS1S0")
MIX = [((4096, 512), "bfloat16", A, B), ((300, 260), "float32", P, B),
       ((1000, 7), "int32", B, A), ((64, 32, 16), "float16", A3, B3)]
"""Sends kept as columns (the all-to-alls, boxes of rank 2 and 3) and task objects
(reductions, broadcasts, sends planned one by one) in one plan."""

DEVICES = (0, 5, 64, 127, 999)


def _whole(requests, strategy="broadcast", **kw):
    plan = reshard.plan_many(requests, cluster=CL, strategy=strategy, **kw)
    return plan, {d: PlanShare.of_plan(plan, d) for d in DEVICES}


def _same(share: PlanShare, want: PlanShare) -> None:
    assert share.tasks == want.tasks
    assert share.groups == want.groups
    assert share.digest == want.digest
    assert share.size == want.size
    assert share.tensors == want.tensors and share.strategy is want.strategy


@pytest.mark.parametrize("strategy", ["broadcast", "send_recv", "allgather"])
def test_a_large_plans_share_is_planned_alone_and_equals_the_whole_plans_cut(strategy):
    plan, want = _whole(MIX, strategy)
    assert len(plan.tasks) > ALTERNATIVES_UP_TO
    tensors, cluster = planned_tensors(MIX, CL, None, None)
    ordered, _ = ordered_tasks(tensors, cluster, Strategy.parse(strategy), fan_out=False)
    assert len(ordered.objects) > 100 and len(ordered.send_columns.position) > 100
    assert ordered.tasks() == plan.tasks
    for d in DEVICES:
        share = plan_share(MIX, d, CL, strategy)
        assert share.plan is None  # the other tasks were never built
        _same(share, want[d])
        assert share_program(share) == WorkerProgram.of(plan, d)
        assert share_program(share, all_groups=False) == programs(
            plan, (d,), all_groups=False)[d]


def test_an_all_to_alls_share_holds_only_its_devices_sends():
    n = 64
    src = Layout(DeviceMesh((n // 8, 8)), "S01R")
    dst = Layout(DeviceMesh((n // 8, 8), devices=range(n, 2 * n)), "RS10")
    reqs = [((1024, 1024), "float32", src, dst)]
    cluster = Cluster.preset("dgx-h100", 2 * n // 8)
    plan = reshard.plan_many(reqs, cluster=cluster)
    for d in (0, 7, n, 2 * n - 1):
        share = plan_share(reqs, d, cluster)
        assert share.plan is None and len(share.tasks) == n
        _same(share, PlanShare.of_plan(plan, d))


@pytest.mark.parametrize("kw", [{}, {"memory_budget": 1 << 16},
                                {"cast": "float8_e4m3fn", "scale": "block128"}],
                         ids=["small", "budget", "scaled-cast"])
def test_plans_the_shortcut_does_not_cover_are_built_whole_and_cut(kw):
    reqs = MIX[:1] if kw else [((64, 48), "float32", Layout(DeviceMesh((2, 2)), "S01R"),
                                Layout(DeviceMesh((2, 2), devices=range(4, 8)), "RS10"))]
    plan, want = _whole(reqs, **kw)
    for d in DEVICES:
        share = plan_share(reqs, d, CL, **kw)
        assert share.plan == plan
        _same(share, want[d])


def test_the_share_refuses_what_plan_many_refuses():
    with pytest.raises(reshard.SpecError):
        plan_share([((63, 48, 2), "float32", A, B)], 0, CL)
    with pytest.raises(reshard.ReshardError, match="memory_budget"):
        plan_share(MIX, 0, CL, memory_budget=0)


def _tweaks(plan: ReshardPlan):
    """Plans that differ from ``plan`` in one task field or in the order."""
    tasks = list(plan.tasks)
    send = next(i for i, t in enumerate(tasks) if t.kind is TaskKind.SEND)
    other = next(i for i, t in enumerate(tasks)
                 if t.kind is not TaskKind.SEND and len(t.receivers) > 1)
    s, o = tasks[send], tasks[other]
    (lo, hi), *rest = s.box
    changes = [(send, dataclasses.replace(s, nbytes=s.nbytes + 1)),
               (send, dataclasses.replace(s, step=s.step + 1)),
               (send, dataclasses.replace(s, root=s.root + 1)),
               (send, dataclasses.replace(s, receivers=(s.receivers[0] + 1,))),
               (send, dataclasses.replace(s, box=((lo, hi + 1), *rest))),
               (send, dataclasses.replace(s, tensor=s.tensor + 1)),
               (send, dataclasses.replace(s, source=Buffer.DST)),
               (send, dataclasses.replace(s, kind=TaskKind.BROADCAST)),
               (other, dataclasses.replace(o, nbytes=o.nbytes + 1)),
               (other, dataclasses.replace(o, receivers=o.receivers[::-1]))]
    for i, t in changes:
        yield (*tasks[:i], t, *tasks[i + 1:])
    yield tuple(tasks[1:] + tasks[:1])


def test_the_digest_changes_with_any_task_field_and_with_the_order():
    plan = reshard.plan_many(MIX[:4], cluster=CL)
    tweaked = list(_tweaks(plan))
    seen = {plan.digest()} | {ReshardPlan(plan.tensors, tasks, plan.strategy,
                                          plan.cluster).digest() for tasks in tweaked}
    assert len(seen) == 1 + len(tweaked)

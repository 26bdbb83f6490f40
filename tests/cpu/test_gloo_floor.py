"""The bare-gloo replay of a plan's messages (:mod:`reshard.microbench.gloo_floor`)."""

from __future__ import annotations

import pytest

from reshard import Cluster, DeviceMesh, Layout, plan
from reshard.microbench import gloo_floor
from reshard.planner.tasks import Task, TaskKind

pytestmark = pytest.mark.cpu


def _plan(dst_devices: list[int], strategy: str = "broadcast"):
    cl = Cluster.regular(1, 1 + len(dst_devices))
    src = Layout(DeviceMesh((1, 1), [0]), "RR")
    dst = Layout(DeviceMesh((1, len(dst_devices)), dst_devices), "RR")
    return plan((64, 32), "float32", src, dst, cluster=cl, strategy=strategy)


def test_a_plans_messages_are_its_tasks_edges_by_step():
    p = _plan([1, 2, 3])
    steps = gloo_floor.plan_steps(p.tasks)
    want: dict[int, list] = {}
    for t in p.tasks:
        want.setdefault(t.step, []).extend((a, b, t.nbytes) for a, b in t.edges())
    assert steps == tuple(tuple(want[s]) for s in sorted(want))
    # every receiver gets every byte of the tensor once
    into: dict[int, int] = {}
    for step in steps:
        for _, b, n in step:
            into[b] = into.get(b, 0) + n
    assert into == {1: 64 * 32 * 4, 2: 64 * 32 * 4, 3: 64 * 32 * 4}


def test_copies_send_nothing_reductions_chain_into_their_root_allgathers_refused():
    box = ((0, 4),)
    assert gloo_floor.task_edges(Task(TaskKind.COPY, 0, box, 2, (2,), 16, 0)) == []
    red = Task(TaskKind.REDUCE, 0, box, 0, (3, 1), 16, 0)
    assert gloo_floor.task_edges(red) == [(3, 1, 16), (1, 0, 16)]
    with pytest.raises(ValueError, match="all-gather"):
        gloo_floor.task_edges(Task(TaskKind.ALLGATHER, 0, box, 0, (0, 1), 16, 0))


@pytest.mark.timeout(180)
def test_bare_gloo_replays_a_plan():
    p = _plan([1, 2])
    rows = [gloo_floor.Row("tiny", 64 * 32 * 4, 3, gloo_floor.plan_steps(p.tasks),
                           p.lower_bound())]
    (seconds,) = gloo_floor.floors(rows, rounds=3, repeats=1)
    assert 0 < seconds < 10

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
@pytest.mark.parametrize("transport", sorted(gloo_floor.TRANSPORTS))
def test_a_plan_replays_over_each_transport(transport):
    # a chain 0 -> 1 -> 2 and a second step back from 2 to 0: both directions of
    # connections, a relay, two steps, one message per connection and step
    p = _plan([1, 2])
    steps = (*gloo_floor.plan_steps(p.tasks), ((2, 0, 1000), (2, 0, 24)))
    rows = [gloo_floor.Row("tiny", 64 * 32 * 4, 3, steps, p.lower_bound())]
    (seconds,) = gloo_floor.floors(rows, rounds=3, repeats=1, transport=transport)
    assert 0 < seconds < 10


@pytest.mark.timeout(120)
def test_a_failing_or_stuck_replay_fails_instead_of_hanging():
    # rank 3 is outside the world of 3: the sockets replay has no port for it (its
    # sender fails at once); gloo waits for ever on it (the call's timeout ends it)
    rows = [gloo_floor.Row("bad", 16, 3, (((0, 3, 16),),), 1e-6)]
    with pytest.raises(RuntimeError, match="sockets processes failed: rank 0: IndexError"):
        gloo_floor.floors(rows, rounds=1, repeats=1, transport="sockets")
    with pytest.raises(RuntimeError, match="gloo processes failed: 3 not done after 15 s"):
        gloo_floor.floors(rows, rounds=1, repeats=1, transport="gloo", timeout=15)

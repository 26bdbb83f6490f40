"""planner.stepgate: the cost model's step rule as array bookkeeping, held to the rule
as the plan IR states it (a task starts once every device of it has no unfinished
task in an earlier step), over random stepped plans ended in random order."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster
from reshard.planner.costing.stepgate import StepGate
from reshard.planner.ir import ReshardPlan
from reshard.planner.values.tasks import Task, TaskKind

from ..common import problems

CLUSTER = Cluster.regular(4, 2)


def _may_start(tasks, ended: set[int], i: int) -> bool:
    """The rule itself: no device of task ``i`` has an unfinished task of an earlier
    step."""
    mine = set(tasks[i].devices)
    return all(j in ended for j, t in enumerate(tasks)
               if t.step < tasks[i].step and mine & set(t.devices))


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(problem=problems(CLUSTER.devices, max_ndim=2, max_size=8),
       strategy=st.sampled_from(["broadcast", "send_recv", "allgather"]),
       data=st.data())
def test_the_gate_starts_exactly_what_the_rule_allows(problem, strategy, data):
    shape, dtype, src, dst = problem
    p = reshard.plan(shape, dtype, src, dst, cluster=CLUSTER, strategy=strategy)
    steps = sorted(data.draw(st.lists(st.integers(0, 4), min_size=len(p.tasks),
                                      max_size=len(p.tasks))))
    tasks = tuple(replace(t, step=s) for t, s in zip(p.tasks, steps, strict=True))
    rng = random.Random(data.draw(st.integers(0, 2**16)))
    gate = StepGate(tasks)
    started = set(gate.start().tolist())
    ended: set[int] = set()
    assert started == {i for i in range(len(tasks)) if _may_start(tasks, ended, i)}
    while len(ended) < len(tasks):
        running = sorted(started - ended)
        assert running, "the gate stalled"
        batch = rng.sample(running, rng.randint(1, len(running)))
        ended |= set(batch)
        new = gate.ended(np.array(sorted(batch), dtype=np.int64))
        assert not set(new.tolist()) & started, "a task started twice"
        started |= set(new.tolist())
        assert started == {i for i in range(len(tasks)) if _may_start(tasks, ended, i)}


def test_memberships_are_each_tasks_distinct_devices_in_task_order():
    tasks = (Task(TaskKind.SEND, 0, ((0, 4),), 3, (5,), 16, step=0),
             Task(TaskKind.BROADCAST, 0, ((0, 4),), 1, (2, 1, 7), 16, step=1))
    gate = StepGate(tasks)
    assert gate.member_task.tolist() == [0, 0, 1, 1, 1]
    assert gate.member_dev.tolist() == [3, 5, 1, 2, 7]
    assert gate.need.tolist() == [2, 3]


@pytest.mark.parametrize("step", [0, 5])
def test_at_step_is_replace(step):
    """Task.at_step builds the task field by field: it must equal dataclasses.replace
    with every field set (a field added to Task and forgotten there fails here)."""
    t = Task(TaskKind.BROADCAST, 3, ((0, 4), (2, 6)), 1, (2, 4, 6), 32, step=2,
             pieces=(((0, 2), (2, 6)),), through=(4,), parents=(1, 2, 2), addends=(9,),
             addend_parents=(1,))
    assert t.at_step(step) == replace(t, step=step)
    assert t.at_step(2) is t


def test_plans_keep_their_predictions_with_routes_shared_per_edge():
    """The cost model's routes look each (sender, receiver) edge up once per plan: a
    plan's prediction equals one made from routes built a task at a time."""
    from reshard.planner.costing import cost

    c = Cluster.preset("dgx-h100", 4)
    a = reshard.DeviceMesh((2, 8), range(16))
    b = reshard.DeviceMesh((2, 8), range(16, 32))
    p = reshard.plan((4096, 1024), "bfloat16", reshard.Layout(a, "S0R"),
                     reshard.Layout(b, "RS0"), cluster=c)
    shared = cost.task_routes(p.tasks, c)
    alone = tuple(cost.task_path(t, c) for t in p.tasks)
    assert [(list(r), lat) for r, lat in shared] == [(list(r), lat) for r, lat in alone]
    fresh = ReshardPlan(p.tensors, p.tasks, p.strategy, c)
    assert cost.simulate(fresh).time == p.estimate()


def _random_tasks(rng: random.Random, n: int, ndev: int) -> tuple[Task, ...]:
    """``n`` broadcasts over devices below ``ndev``, some naming a device twice (an
    addend also a receiver), in steps 0-3."""
    out = []
    for _ in range(n):
        picked = rng.sample(range(ndev), rng.randint(3, 40))
        addends = tuple(rng.sample(picked[1:], 2)) if rng.random() < 0.3 else ()
        out.append(Task(TaskKind.BROADCAST, 0, ((0, 4),), picked[0], tuple(picked[1:]), 16,
                        step=rng.randint(0, 3), addends=addends))
    return tuple(out)


@pytest.mark.parametrize("ndev", [64, 1 << 20])  # a flag per (task, device); a sort
def test_many_members_as_arrays_gate_as_task_by_task(ndev, monkeypatch):
    """The distinct devices of many memberships found as arrays (ascending) give the
    same memberships as sets and the same starts, end after end, as task by task."""
    from reshard.planner.costing import stepgate

    rng = random.Random(ndev)
    tasks = _random_tasks(rng, 300, ndev)
    assert sum(len(t.devices) for t in tasks) >= stepgate.ARRAY_MEMBERS
    arrays = StepGate(tasks)
    monkeypatch.setattr(stepgate, "ARRAY_MEMBERS", 1 << 30)
    one_by_one = StepGate(tasks)
    assert arrays.need.tolist() == one_by_one.need.tolist()
    assert arrays.member_task.tolist() == one_by_one.member_task.tolist()
    at = np.concatenate([[0], np.cumsum(arrays.need)])
    for t in range(len(tasks)):
        mine = arrays.member_dev[at[t]:at[t + 1]].tolist()
        assert mine == sorted(set(tasks[t].devices))
        assert sorted(one_by_one.member_dev[at[t]:at[t + 1]].tolist()) == mine
    started = arrays.start().tolist()
    assert started == one_by_one.start().tolist()
    running, ended = set(started), 0
    while ended < len(tasks):
        assert running, "the gate stalled"
        batch = np.array(sorted(rng.sample(sorted(running), rng.randint(1, len(running)))))
        running -= set(batch.tolist())
        ended += len(batch)
        new = arrays.ended(batch).tolist()
        assert new == one_by_one.ended(batch).tolist()
        running |= set(new)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_step_gate_as_step_gate(seed):
    """Tasks all in one step: :func:`gate_of` gives the one-step rule, whose starts, end
    after end, are the full gate's (everything at once, nothing after)."""
    from reshard.planner.costing.stepgate import OneStep, gate_of

    rng = random.Random(seed)
    tasks = tuple(t.at_step(seed) for t in _random_tasks(rng, 200, 64))
    fast, full = gate_of(tasks), StepGate(tasks)
    assert isinstance(fast, OneStep)
    started = fast.start()
    assert started.dtype == np.int64
    assert started.tolist() == full.start().tolist() == list(range(len(tasks)))
    left = list(range(len(tasks)))
    rng.shuffle(left)
    while left:
        batch = np.array(sorted(left[:rng.randint(1, 40)]), dtype=np.int64)
        left = left[len(batch):]
        assert fast.ended(batch).tolist() == full.ended(batch).tolist() == []


def test_gate_of_keeps_the_full_gate_for_many_steps_or_a_task_of_no_device():
    from reshard.planner.costing.stepgate import gate_of

    rng = random.Random(7)
    tasks = tuple(t.at_step(0) for t in _random_tasks(rng, 20, 64))
    assert isinstance(gate_of((*tasks[:-1], tasks[-1].at_step(1))), StepGate)
    nobody = Task(TaskKind.COPY, 0, ((0, 4),), -1, (), 16, step=0)
    assert isinstance(gate_of((*tasks, nobody)), StepGate)
    assert isinstance(gate_of(()), StepGate)  # an empty plan: the full gate (no tasks)


def test_one_step_plans_simulate_as_with_the_full_gate(monkeypatch):
    """A plan whose tasks are all in one step simulates to the same starts, ends and
    time with the one-step rule as with :class:`StepGate`."""
    from reshard.planner.costing import fluid

    c = Cluster.preset("dgx-h100", 4)
    a = reshard.DeviceMesh((2, 8), range(16))
    b = reshard.DeviceMesh((2, 8), range(16, 32))
    for src, dst, strategy in (("S0R", "RS0", "broadcast"), ("S01R", "RR", "allgather"),
                               ("S0R", "RR", "broadcast")):
        p = reshard.plan((4096, 1024), "bfloat16", reshard.Layout(a, src),
                         reshard.Layout(b, dst), cluster=c, strategy=strategy)
        tasks = tuple(t.at_step(0) for t in p.tasks)
        fresh = ReshardPlan(p.tensors, tasks, p.strategy, c)
        fast = fluid.simulate(fresh)
        with monkeypatch.context() as m:
            m.setattr(fluid, "gate_of", StepGate)
            full = fluid.simulate(ReshardPlan(p.tensors, tasks, p.strategy, c))
        assert fast == full

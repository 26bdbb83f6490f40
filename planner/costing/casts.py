"""What a cast on the wire costs the cost model: the time each device spends converting
the boxes it sends in a step, before that step's transfers start
(``Cluster.cast_bandwidth``).

The executor prepares a device's payloads of a step (a box read in the source dtype,
its block scales derived where the cast has them, written in the wire's dtype), then
issues the step's transfers (:mod:`reshard.comm.execution`). So a device's step begins
with its conversions, one after another, and a task of that step waits for those of
each of its devices. Who converts what: the root of a send, a broadcast or a local
copy converts its box; each member of an all-gather its share. A reduction carries its
addends in the accumulator and converts its sum where it lands, which this model does
not price (a partial sum cast on the wire is rare; its adds are not priced either).

A device prepares its step's tasks in plan order: a coalesced message
(:mod:`reshard.planner.schedule.coalesce`) is issued as soon as its payloads are ready
(the conversions before it in the step and its own), any other task once every payload
of the step is. A task's wait is the longest such among its devices, added to its
latency: devices that entered the step at different times would start converting at
different times, so this errs slow by at most the difference.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from reshard.dtypes import ScaleMode, itemsize
from reshard.layout import box_size
from reshard.planner.schedule.coalesce import messages
from reshard.planner.schedule.staging import step_runs
from reshard.planner.values.plan_view import PlanView, Route
from reshard.planner.values.tasks import Task, TaskKind, TensorSpec

_ROOT_CONVERTS = frozenset({TaskKind.SEND, TaskKind.BROADCAST, TaskKind.COPY})
"""Kinds whose root converts the whole box (an all-gather's members convert a share
each; a reduction converts nothing before it moves)."""


def converts(tensor: TensorSpec) -> bool:
    """Whether moving ``tensor`` converts its source (another dtype on the wire, or
    scales)."""
    return tensor.out_dtype != tensor.dtype or tensor.scale is not ScaleMode.NONE


def _converted(task: Task, tensor: TensorSpec) -> dict[int, float]:
    """Source bytes each device converts for ``task`` (by device; an all-gather's
    members a share each, exactly: the shares sum to the box, as the lower bound
    counts it)."""
    nbytes = box_size(task.box) * itemsize(tensor.dtype)
    if task.kind in _ROOT_CONVERTS:
        return {task.root: nbytes}
    if task.kind is TaskKind.ALLGATHER:
        k = max(len(task.receivers), 1)
        return dict.fromkeys(task.receivers, nbytes / k)
    return {}


def cast_waits(plan: PlanView) -> np.ndarray | None:
    """Per task of ``plan`` (in its order), the seconds it waits for its devices'
    conversions in its step (module docstring); None where the cluster converts for
    free or the plan converts nothing."""
    rate = plan.cluster.cast_bandwidth
    tensors, tasks = plan.tensors, plan.tasks
    if not rate or not any(map(converts, tensors)):
        return None
    cost = [_converted(t, tensors[t.tensor]) if converts(tensors[t.tensor]) else {}
            for t in tasks]
    waits = np.zeros(len(tasks))
    for run in step_runs(tasks):
        groups = {i: [j for j, _ in m]
                  for m in messages(run, lambda r: r[1], lambda t: tensors[t.tensor])
                  for i, _ in m}
        for d, mine in _by_device(run).items():
            done, ready, after = 0.0, {}, []
            for i in mine:
                group = groups.get(i)
                if group is None:  # issued once the step's every payload is ready
                    done += cost[i].get(d, 0)
                    after.append(i)
                elif i == group[0]:  # a message: issued once its payloads are ready
                    done += sum(cost[j].get(d, 0) for j in group)
                    ready.update(dict.fromkeys(group, done))
            ready.update(dict.fromkeys(after, done))
            for i, at in ready.items():
                waits[i] = max(waits[i], at / rate)
    return waits if waits.any() else None


def _by_device(run: list[tuple[int, Task]]) -> dict[int, list[int]]:
    """A step's task indices by each device they involve, in plan order."""
    out: dict[int, list[int]] = collections.defaultdict(list)
    for i, t in run:
        for d in dict.fromkeys(t.devices):
            out[d].append(i)
    return out


def conversion_seconds(plan: PlanView) -> dict[int, float]:
    """Seconds each device spends converting what it sends over the whole plan (by
    device; empty where the cluster converts for free or the plan converts nothing).
    Where a device runs one task at a time, each of its tasks waits at least for its
    own conversions: :func:`~reshard.planner.costing.cost.one_at_a_time_time` counts
    them."""
    rate = plan.cluster.cast_bandwidth
    out: dict[int, float] = collections.defaultdict(float)
    if rate:
        for t in plan.tasks:
            tensor = plan.tensors[t.tensor]
            if converts(tensor):
                for d, nbytes in _converted(t, tensor).items():
                    out[d] += nbytes / rate
    return dict(out)


def task_latencies(plan: PlanView, routes: Sequence[Route]) -> np.ndarray:
    """Per task of ``plan``, its route's latency and its wait for conversions
    (:func:`cast_waits`): what the simulation and its floor wait before its bytes
    flow."""
    lat = np.array([lt for _, lt in routes], dtype=np.float64)
    waits = cast_waits(plan)
    return lat if waits is None else lat + waits


__all__ = ["cast_waits", "conversion_seconds", "converts", "task_latencies"]

"""The global task order every worker follows.

A plan's steps are groups whose tasks run concurrently on every device (one NCCL
group; gloo's asynchronous operations), so the order needs no packing of
device-disjoint rounds: the fluid sharing of the NICs that concurrency gives keeps
every NIC busy while it has bytes to move. Steps only express dependencies: a task's
step is one more than the latest step of any task whose result it reads (a transfer
of a reduced partial-sum piece after that piece's reduction, an intra-host all-gather
after the transfers that delivered its pieces), so reductions, transfers and
all-gathers of different pieces overlap (pipelining).

Inside a step the issue order is a rotation: source host ``i`` first addresses
destination host ``i + 1``, then ``i + 2``, ... (tasks sorted by the host distance
``(dst - src) mod H``), so that a backend issuing one operation at a time (or a
window of them) still spreads its early transfers over distinct NIC pairs; then
largest first. Every worker issues its tasks in this one order, so the
lowest-numbered unfinished task always has all its participants waiting on it: no
set of blocking collectives can deadlock.

Concurrency is not free on every backend: operations in flight at once compete for a
device's CPU and memory, and gloo's TCP streams through one NIC interleave less
smoothly than the fluid model's fair sharing. :func:`one_at_a_time` gives the same
tasks in device-disjoint steps; the planner keeps that form when the model predicts
no gain from concurrency (see :func:`reshard.planner.plan.plan_many`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from reshard.cluster import Cluster
from reshard.planner.ir import Task, TaskKind

PHASE = {
    TaskKind.REDUCE: 0,
    TaskKind.COPY: 1,
    TaskKind.SEND: 1,
    TaskKind.BROADCAST: 1,
    TaskKind.ALLGATHER: 2,
}


def order_tasks(tasks: Iterable[Task], cluster: Cluster) -> tuple[Task, ...]:
    """Sort tasks (whose ``step`` the planner set from their dependencies) into the
    plan's global order: by step, then phase, then rotation distance, largest first,
    then tensor and box (deterministic)."""
    nh = max(1, cluster.num_hosts)
    host = {d: h for h, devs in enumerate(cluster.hosts) for d in devs}
    copy = TaskKind.COPY

    def key(t: Task) -> tuple:
        if t.root >= 0 and t.kind is not copy:
            dist = (host[t.receivers[0]] - host[t.root]) % nh
        else:
            dist = 0
        return (t.step, PHASE[t.kind], dist, -t.nbytes, t.tensor, t.box, t.root)

    return tuple(sorted(tasks, key=key))


def one_at_a_time(tasks: Sequence[Task]) -> tuple[Task, ...]:
    """The same tasks (in global order) restepped so that no device has two in one
    step: each task one step after the last step of any of its devices. A task that
    reads another's result shares a device with it (the data sits on one), so every
    dependency still points to an earlier step."""
    last: dict[int, int] = {}
    out = []
    for t in tasks:
        step = 1 + max((last.get(d, -1) for d in t.devices), default=-1)
        for d in t.devices:
            last[d] = step
        out.append(t if t.step == step else dataclasses.replace(t, step=step))
    out.sort(key=lambda t: t.step)  # stable: every device keeps its order
    return tuple(out)

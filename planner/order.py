"""The global task order every worker follows.

Tasks are taken by phase (reductions, then transfers and copies, then intra-host
all-gathers, which consume what the transfers delivered), largest first within a
phase, and list-scheduled: a task gets a step after the last step of each of its
devices, choosing, within a short window, the step whose host NICs (per direction)
carry the fewest bytes so far, so that transfers between disjoint hosts share a step
and no NIC is loaded twice while another idles. Tasks of one step have disjoint
devices and run together; the plan's order is by step. Because every worker issues its tasks in this one order, the
lowest-numbered unfinished task always has all its participants waiting on it, so no
set of blocking collectives can deadlock.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from reshard.cluster import Cluster
from reshard.planner.ir import Task, TaskKind

PHASE = {
    TaskKind.REDUCE: 0,
    TaskKind.COPY: 1,
    TaskKind.SEND: 1,
    TaskKind.BROADCAST: 1,
    TaskKind.ALLGATHER: 2,
}


WINDOW = 128
"""Candidates (by priority) a step considers; bounds planning time on huge plans."""


def nic_resources(task: Task, cluster: Cluster) -> tuple[tuple[str, int], ...]:
    """The host NIC directions a task's bytes cross."""
    hosts: list[int] = []
    devs = task.devices if task.kind is not TaskKind.REDUCE else (*task.receivers, task.root)
    for d in devs:
        h = cluster.host_of(d)
        if h not in hosts:
            hosts.append(h)
    if len(hosts) < 2:
        return ()
    return (("out", hosts[0]), *(("in", h) for h in hosts[1:]),
            *(("out", h) for h in hosts[1:-1]))


def order_tasks(tasks: Iterable[Task], cluster: Cluster) -> tuple[Task, ...]:
    """Assign steps and return the tasks in global order.

    Steps are filled one at a time. Within a phase, the step takes candidates in
    priority order (largest first) whose devices are still free in the step, as long
    as a candidate does not raise the step's NIC level (the most bytes on one host NIC
    direction in the step); the level is then raised to the smallest increase any
    remaining candidate needs, and the pass repeats until no candidate fits. Each step
    is thus a maximal set of device-disjoint tasks that loads the host NICs evenly.
    """
    items = list(tasks)
    devs = [t.devices for t in items]
    nbytes = [t.nbytes for t in items]
    all_devices = len({d for ds in devs for d in ds})
    order: list[Task] = []
    last: dict[int, int] = {}  # device -> its last step so far
    for phase in sorted({PHASE[t.kind] for t in items}):
        todo = sorted((i for i, t in enumerate(items) if PHASE[t.kind] == phase),
                      key=lambda i: (-nbytes[i], i))
        nics = {i: nic_resources(items[i], cluster) for i in todo}
        floor = {d: s + 1 for d, s in last.items()}
        step = min((max((floor.get(d, 0) for d in devs[i]), default=0) for i in todo),
                   default=0)
        while todo:
            window = todo[:WINDOW]
            used: set[int] = set()
            load: dict[tuple[str, int], int] = {}
            taken: list[int] = []
            level = 0
            open_ = [i for i in window
                     if not floor or all(floor.get(d, 0) <= step for d in devs[i])]
            while open_ and len(used) < all_devices:
                raise_to = None
                rest = []
                for i in open_:
                    ds = devs[i]
                    if not used.isdisjoint(ds):
                        continue
                    nb = nbytes[i]
                    new = max((load.get(r, 0) + nb for r in nics[i]), default=0)
                    if new <= (level if load else max(level, nb)):
                        taken.append(i)
                        used.update(ds)
                        for r in nics[i]:
                            load[r] = load.get(r, 0) + nb
                        level = max(level, new)
                    else:
                        rest.append(i)
                        if raise_to is None or new < raise_to:
                            raise_to = new
                if raise_to is None:
                    break
                open_ = rest
                level = raise_to
            for i in sorted(taken):
                order.append(dataclasses.replace(items[i], step=step))
                for d in devs[i]:
                    last[d] = step
            if taken:
                gone = set(taken)
                todo = [i for i in window if i not in gone] + todo[WINDOW:]
            step += 1
    # A later phase may reuse step numbers of devices it does not touch; sorting by step
    # (stably) keeps every device's own order.
    order.sort(key=lambda t: t.step)
    return tuple(order)

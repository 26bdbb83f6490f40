"""Cost model and lower bound.

Cost model (alpha-beta with contention): the plan's tasks run as a fluid simulation.
A task starts when each of its devices has finished its earlier tasks (the plan's
global order), spends a latency, then moves its bytes through every resource on its
path: the NIC of each host it leaves and enters (one direction each), the intra-host
link of each device it leaves and enters, or a device's copy engine. Concurrent tasks
share a resource max-min fairly. A broadcast is a pipelined chain root -> receivers
(each host boundary crossed once); an all-gather is a ring (each member receives
(k-1)/k of the box); a reduction is the reverse chain.

Lower bound: no plan is faster than the largest of: the bytes a host must receive that
none of its devices holds, over its NIC bandwidth; the bytes leaving a set of hosts
that alone hold some slices needed elsewhere, over their NICs; the bytes a device must
receive that it does not hold, over its link; plus one latency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from reshard.cluster import Cluster
from reshard.layout import box_size
from reshard.planner.decompose import decompose, devices_by_box
from reshard.planner.ir import ReshardPlan, Task, TaskKind, TensorSpec

Resource = tuple[str, int]


@dataclass(frozen=True)
class Estimate:
    """A cost-model prediction.

    Attributes:
        time: predicted seconds for the whole plan.
        starts: per task (plan order) its predicted start time.
        ends: per task its predicted end time.
        busiest: the resource that carried the most bytes, and its bytes.
    """

    time: float
    starts: tuple[float, ...]
    ends: tuple[float, ...]
    busiest: tuple[str, int, float]


def _chain_hosts(cluster: Cluster, devices: Sequence[int]) -> list[int]:
    hosts: list[int] = []
    for d in devices:
        h = cluster.host_of(d)
        if not hosts or hosts[-1] != h:
            hosts.append(h)
    return hosts


def task_path(task: Task, cluster: Cluster) -> tuple[list[tuple[Resource, float]], float]:
    """Resources a task's bytes cross (with the fraction of the bytes on each) and its
    fixed latency."""
    if task.kind is TaskKind.COPY:
        return [(("copy", task.root), 1.0)], 0.0
    if task.kind is TaskKind.ALLGATHER:
        k = len(task.receivers)
        frac = (k - 1) / k if k else 0.0
        path: list[tuple[Resource, float]] = []
        for d in task.receivers:
            path += [(("dev_in", d), frac), (("dev_out", d), frac)]
        hosts = sorted({cluster.host_of(d) for d in task.receivers})
        if len(hosts) > 1:
            for h in hosts:
                path += [(("nic_in", h), frac), (("nic_out", h), frac)]
        lat = cluster.latency * (len(hosts) - 1) + cluster.intra_latency * (k - 1)
        return path, lat
    if task.kind is TaskKind.REDUCE:
        chain = [*task.receivers, task.root]
    else:
        chain = [task.root, *task.receivers]
    path = []
    for d in chain[:-1]:
        path.append((("dev_out", d), 1.0))
    for d in chain[1:]:
        path.append((("dev_in", d), 1.0))
    hosts = _chain_hosts(cluster, chain)
    for a, b in zip(hosts, hosts[1:]):
        path += [(("nic_out", a), 1.0), (("nic_in", b), 1.0)]
    lat = cluster.latency * (len(hosts) - 1) + cluster.intra_latency * (len(chain) - len(hosts))
    return path, lat


def _capacity(res: Resource, cluster: Cluster) -> float:
    kind = res[0]
    if kind.startswith("nic"):
        return cluster.nic_bandwidth
    if kind == "copy":
        return cluster.copy_bandwidth
    return cluster.intra_bandwidth


def _fair_rates(flowing: list[int], paths: list[list[tuple[Resource, float]]],
                cluster: Cluster) -> dict[int, float]:
    """Max-min fair progress rates (bytes/s of each task) by progressive filling."""
    users: dict[Resource, list[tuple[int, float]]] = {}
    for t in flowing:
        for res, frac in paths[t]:
            if frac > 0:
                users.setdefault(res, []).append((t, frac))
    left = {r: _capacity(r, cluster) for r in users}
    rate: dict[int, float] = {}
    unfrozen = set(flowing)
    while unfrozen:
        level, tight = math.inf, None
        for r, lst in users.items():
            demand = sum(f for t, f in lst if t in unfrozen)
            if demand > 0:
                lv = left[r] / demand
                if lv < level:
                    level, tight = lv, r
        if tight is None:  # tasks that use no bandwidth
            for t in unfrozen:
                rate[t] = math.inf
            break
        for t, _ in users[tight]:
            if t in unfrozen:
                rate[t] = level
                unfrozen.discard(t)
                for r, f in paths[t]:
                    if f > 0:
                        left[r] = max(0.0, left[r] - f * level)
    return rate


def simulate(plan: ReshardPlan) -> Estimate:
    """Run the fluid simulation of ``plan`` on ``plan.cluster``."""
    cluster = plan.cluster
    tasks = plan.tasks
    n = len(tasks)
    paths, lats = [], []
    carried: dict[Resource, float] = {}
    for t in tasks:
        p, lat = task_path(t, cluster)
        paths.append(p)
        lats.append(lat)
        for r, f in p:
            carried[r] = carried.get(r, 0.0) + f * t.nbytes
    queues: dict[int, list[int]] = {}
    for i, t in enumerate(tasks):
        for d in set(t.devices):
            queues.setdefault(d, []).append(i)
    head = {d: 0 for d in queues}
    arrived = [0] * n
    need = [len(set(t.devices)) for t in tasks]
    starts = [0.0] * n
    ends = [0.0] * n
    remaining = [float(t.nbytes) for t in tasks]
    waiting: dict[int, float] = {}  # task -> time its bytes start to flow
    flowing: list[int] = []
    now = 0.0

    def arrive(i: int) -> None:
        arrived[i] += 1
        if arrived[i] == need[i]:
            starts[i] = now
            waiting[i] = now + lats[i]

    for d, q in queues.items():
        arrive(q[0])
    done = 0
    while done < n:
        rates = _fair_rates(flowing, paths, cluster) if flowing else {}
        nxt = min(waiting.values(), default=math.inf)
        fins = {}
        for t in flowing:
            rate = rates[t]
            fins[t] = now + (remaining[t] / rate if rate > 0 else math.inf)
            nxt = min(nxt, fins[t])
        if nxt == math.inf:
            raise RuntimeError("cost simulation stalled; the plan's order is inconsistent")
        dt = nxt - now
        now = nxt
        finished = []
        still = []
        for t in flowing:
            remaining[t] -= rates[t] * dt if rates[t] != math.inf else remaining[t]
            # (the finish-time test also ends tasks whose last bytes would take less
            # than the clock's resolution)
            if fins[t] <= now or remaining[t] <= 1e-9 * max(1.0, tasks[t].nbytes):
                finished.append(t)
            else:
                still.append(t)
        flowing = still
        for t, at in list(waiting.items()):
            if at <= now:
                del waiting[t]
                if remaining[t] <= 0:
                    finished.append(t)
                else:
                    flowing.append(t)
        for t in sorted(finished):
            ends[t] = now
            done += 1
            for d in set(tasks[t].devices):
                head[d] += 1
                if head[d] < len(queues[d]):
                    arrive(queues[d][head[d]])
    busiest = max(carried.items(), key=lambda kv: kv[1], default=(("none", -1), 0.0))
    return Estimate(max(ends, default=0.0), tuple(starts), tuple(ends),
                    (busiest[0][0], busiest[0][1], busiest[1]))


def lower_bound(tensors: Sequence[TensorSpec], cluster: Cluster) -> float:
    """Seconds no plan moving ``tensors`` can beat on ``cluster``."""
    host_in: dict[int, float] = {}
    dev_in: dict[int, float] = {}
    dev_copy: dict[int, float] = {}
    leave: dict[frozenset[int], list[tuple[frozenset[int], float]]] = {}
    crosses_host = moves = False
    for t in tensors:
        itemsize = np.dtype(t.dtype).itemsize
        # A partial source counts as held by every member of its groups: optimistic,
        # so the bound stays a bound.
        cells = decompose(t.shape, devices_by_box(t.src, t.shape),
                          devices_by_box(t.dst, t.shape, t.dst.partial_leaders()))
        for c in cells:
            nbytes = box_size(c.box) * itemsize
            hold_hosts = frozenset(cluster.host_of(d) for d in c.holders)
            need_hosts = {cluster.host_of(d) for d in c.needers}
            for h in need_hosts - hold_hosts:
                host_in[h] = host_in.get(h, 0.0) + nbytes
                crosses_host = True
            for d in c.needers:
                if d in c.holders:
                    dev_copy[d] = dev_copy.get(d, 0.0) + nbytes
                else:
                    dev_in[d] = dev_in.get(d, 0.0) + nbytes
                    moves = True
            if need_hosts - hold_hosts:
                leave.setdefault(hold_hosts, []).append((frozenset(need_hosts), nbytes))
    terms = [0.0]
    terms += [b / cluster.nic_bandwidth for b in host_in.values()]
    terms += [b / cluster.intra_bandwidth for b in dev_in.values()]
    terms += [b / cluster.copy_bandwidth for b in dev_copy.values()]
    # Slices held only inside a host set S and needed outside it leave through S's NICs.
    for s in leave:
        out = sum(nb for hs, items in leave.items() if hs <= s
                  for need, nb in items if not need <= s)
        terms.append(out / (len(s) * cluster.nic_bandwidth))
    lat = cluster.latency if crosses_host else (cluster.intra_latency if moves else 0.0)
    return max(terms) + lat

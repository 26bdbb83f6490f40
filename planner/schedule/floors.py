"""A baseline's floor from its slices alone: seconds the cost model cannot put any of
its plans below, known before a slice is planned.

The default strategy's planner also plans the baselines (``send_recv``, ``allgather``)
and keeps one only where the model says it is faster (:mod:`reshard.planner.plan`).
Building a baseline's tasks and simulating them costs as much as the broadcast plan
itself, yet most of its bytes are fixed by the slices: a slice with one holder is sent
by that holder, whoever receives it. Point to point (``send_recv``) it sends the slice
once per receiver; all-gathered (``allgather``) once per host that needs it, whole to a
host it holds or that has one receiver, else in one piece per receiver there. Those
bytes cross the holder's link out (``DEV_OUT``), each receiver's link in (``DEV_IN``)
and, where they change host, both NICs; an all-gather inside a host moves a share of
the slice in and out of each member's link; the partial sums' reductions (tasks
already built) cross their own routes. The model shares every resource at most at its
capacity (max-min fair rates, :mod:`reshard.planner.costing.fairshare`), so no plan of
these slices ends before the most loaded resource has carried its bytes.

Each of those bytes also has its step: a slice's transfers run at the step its cell may
start at, an all-gather at the step after (it reads what they delivered), a
reduction at its own. The model runs a device's steps one after another (it enters
the next once its tasks of this one have ended), so a device is busy at least, step
after step, for the longest its own resources (its links, and its NIC where no other
device shares it) take to carry that step's bytes (as
:func:`~reshard.planner.costing.cost.stepped_floor` reads a built plan): an all-gather
baseline receives its pieces through the NICs, then passes the rest through the
links, one after the other. Every byte counted is a transfer's (a copy crosses none of
these resources), which flows only once the transfer's latency has passed: at least
the cluster's least latency (``min(latency, intra_latency)``, a hop's) in each step
of a device, and once before the busiest resource's bytes. The floor is the larger of
the two bounds: :func:`baseline_floor`.

What the baselines' searches change keeps that floor: their passes' candidates are
the same sends one at a time a device (``least-concurrent``: a device then carries each
of its tasks alone, no faster than in groups), or the same request cut finer
(``finer``: other reductions where the sources are partial sums, so the caller takes
the lower of the coarse and the fine slices' floors); trees reshape broadcasts, not
the sends, pieces and receipts counted here (and a broadcast's root sends its bytes
once in any shape), in the same steps.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from reshard.cluster import Cluster
from reshard.layout import box_size
from reshard.planner.cells.cell_tasks import split_box
from reshard.planner.costing.cost import task_path
from reshard.planner.schedule.work import WorkList
from reshard.planner.values.resources import (
    COPY,
    DEV_IN,
    DEV_OUT,
    NIC_IN,
    NIC_OUT,
    Resource,
    capacity,
)
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task

FLOOR_MARGIN = 1e-9
"""A floor is compared with a model time after taking this share off it (the model's
rates fill each resource to its capacity up to rounding)."""

Loads = defaultdict[tuple[int, int], float]
"""Bytes by (resource index, step), for one kind of resource."""

StepLoads = dict[tuple[str, tuple[int, int]], float]
"""Bytes by resource kind and (index, step)."""


def baseline_floor(work: WorkList, reduces: Sequence[Task], itemsizes: Sequence[int],
                   cluster: Cluster, strategy: Strategy) -> float:
    """Seconds every plan of ``work``'s slices (after ``reduces``; ``itemsizes``: each
    tensor's bytes per element) under ``strategy`` (``send_recv`` or ``allgather``)
    takes at least in the cost model (module docstring), less :data:`FLOOR_MARGIN`."""
    load: defaultdict[tuple[str, tuple[int, int]], float] = defaultdict(float)
    for t in reduces:  # the reductions', by step
        for (kind, i), frac in task_path(t, cluster)[0]:
            load[(kind, (i, t.step))] += frac * t.nbytes
    host, nic = cluster.host_map, cluster.nic_map
    # per kind of resource, by (index, step) (a dict a kind: the loop below is the hot part)
    dev_out: Loads = defaultdict(float)
    dev_in: Loads = defaultdict(float)
    nic_out: Loads = defaultdict(float)
    nic_in: Loads = defaultdict(float)

    def send(root: int, receiver: int, nbytes: float, step: int) -> None:
        """``root`` sends ``nbytes`` to ``receiver`` at ``step`` (a send, or a chain's
        first edge)."""
        dev_out[(root, step)] += nbytes
        dev_in[(receiver, step)] += nbytes
        if host[root] != host[receiver]:
            nic_out[(nic[root], step)] += nbytes
            nic_in[(nic[receiver], step)] += nbytes

    p2p = work.point_to_point()
    cell_steps, row_steps = work.steps()
    for root, recv, nb, step in zip(p2p.root.tolist(), p2p.recv.tolist(),
                                    p2p.nbytes.tolist(), row_steps.tolist()):
        send(root, recv, nb, step)
    point_to_point = strategy is Strategy.SEND_RECV
    for (tensor, cell), step in zip(work.general, cell_steps):
        receivers = sorted(cell.needers - cell.holders)
        nbytes = cell.size * itemsizes[tensor]
        if not receivers or not nbytes:
            continue
        if len(cell.holders) != 1:  # the sender is a choice; the receipts are not
            if point_to_point:
                for r in receivers:
                    dev_in[(r, step)] += nbytes
            continue
        (root,) = cell.holders
        if point_to_point:
            for r in receivers:
                send(root, r, nbytes, step)
            continue
        by_host: dict[int, list[int]] = {}
        for r in receivers:
            by_host.setdefault(host[r], []).append(r)
        for h, members in by_host.items():
            if h == host[root] or len(members) == 1:  # whole, down a chain or sent
                send(root, members[0], nbytes, step)
                for m in members[1:]:
                    dev_in[(m, step)] += nbytes
                continue
            item = itemsizes[tensor]
            for m, piece in zip(members, split_box(cell.box, len(members))):
                if box_size(piece):
                    send(root, m, box_size(piece) * item, step)
            share = nbytes * (len(members) - 1) / len(members)  # the all-gather's
            for m in members:
                dev_in[(m, step + 1)] += share
                dev_out[(m, step + 1)] += share
    for kind, part in ((DEV_OUT, dev_out), (DEV_IN, dev_in), (NIC_OUT, nic_out),
                       (NIC_IN, nic_in)):
        for key, b in part.items():
            load[(kind, key)] += b
    # every byte counted here is a transfer's, which flows only after its latency
    wait = min(cluster.latency, cluster.intra_latency)
    busiest = _busiest(load, cluster)
    return max(busiest + wait if busiest > 0 else 0.0, _stepped(load, cluster, wait)) * \
        (1 - FLOOR_MARGIN)


def _busiest(load: StepLoads, cluster: Cluster) -> float:
    """The most loaded resource's seconds, its bytes of every step together."""
    total: defaultdict[Resource, float] = defaultdict(float)
    for (kind, (i, _)), b in load.items():
        total[(kind, i)] += b
    return max((b / capacity(res, cluster) for res, b in total.items()), default=0.0)


def _stepped(load: StepLoads, cluster: Cluster, wait: float = 0.0) -> float:
    """The busiest device's steps end to end: per device, over its steps, its own
    resources' longest time a step, after ``wait`` (the least latency of a transfer)
    a step (module docstring)."""
    on_nic = Counter(cluster.nic_map.values())
    alone = {n: d for d, n in cluster.nic_map.items() if on_nic[n] == 1}
    window: defaultdict[tuple[int, int], float] = defaultdict(float)  # (device, step)
    for (kind, (i, step)), b in load.items():
        if kind in (DEV_IN, DEV_OUT, COPY):
            owner = i
        elif kind in (NIC_IN, NIC_OUT) and i in alone:
            owner = alone[i]
        else:
            continue
        seconds = b / capacity((kind, i), cluster)
        window[(owner, step)] = max(window[(owner, step)], seconds)
    busy: defaultdict[int, float] = defaultdict(float)
    for (owner, _), seconds in window.items():
        if seconds > 0:
            busy[owner] += wait + seconds
    return max(busy.values(), default=0.0)


__all__ = ["FLOOR_MARGIN", "baseline_floor"]

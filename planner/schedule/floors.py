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
already built) cross their own routes. The model shares every resource at most at its capacity (max-min fair rates,
:mod:`reshard.planner.costing.fairshare`), so no plan of these slices ends before the
most loaded resource has carried its bytes: :func:`baseline_floor`.

What the baselines' searches change keeps that floor: their passes' candidates are
the same sends in other steps (``least-concurrent``), or the same request cut finer
(``finer``: other reductions where the sources are partial sums, so the caller takes
the lower of the coarse and the fine slices' floors); trees reshape broadcasts, not
the sends and pieces counted here (and a broadcast's root sends its bytes once in any
shape).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from reshard.cluster import Cluster
from reshard.layout import box_size
from reshard.planner.cells.cell_tasks import split_box
from reshard.planner.costing.cost import task_path
from reshard.planner.schedule.work import WorkList
from reshard.planner.values.resources import DEV_IN, DEV_OUT, NIC_IN, NIC_OUT, Resource, capacity
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task

FLOOR_MARGIN = 1e-9
"""A floor is compared with a model time after taking this share off it (the model's
rates fill each resource to its capacity up to rounding)."""


def baseline_floor(work: WorkList, reduces: Sequence[Task], itemsizes: Sequence[int],
                   cluster: Cluster, strategy: Strategy) -> float:
    """Seconds every plan of ``work``'s slices (after ``reduces``; ``itemsizes``: each
    tensor's bytes per element) under ``strategy`` (``send_recv`` or ``allgather``)
    takes at least in the cost model (module docstring), less :data:`FLOOR_MARGIN`."""
    load: defaultdict[Resource, float] = defaultdict(float)
    for t in reduces:
        for res, frac in task_path(t, cluster)[0]:
            load[res] += frac * t.nbytes
    host, nic = cluster.host_map, cluster.nic_map
    # per kind of resource, by index (a dict a kind: the loop below is the hot part)
    dev_out: defaultdict[int, float] = defaultdict(float)
    dev_in: defaultdict[int, float] = defaultdict(float)
    nic_out: defaultdict[int, float] = defaultdict(float)
    nic_in: defaultdict[int, float] = defaultdict(float)

    def send(root: int, receiver: int, nbytes: float) -> None:
        """``root`` sends ``nbytes`` to ``receiver`` (a send, or a chain's first edge)."""
        dev_out[root] += nbytes
        dev_in[receiver] += nbytes
        if host[root] != host[receiver]:
            nic_out[nic[root]] += nbytes
            nic_in[nic[receiver]] += nbytes

    p2p = work.point_to_point()
    for root, recv, nb in zip(p2p.root.tolist(), p2p.recv.tolist(), p2p.nbytes.tolist()):
        send(root, recv, nb)
    point_to_point = strategy is Strategy.SEND_RECV
    for tensor, cell in work.general:
        receivers = sorted(cell.needers - cell.holders)
        nbytes = cell.size * itemsizes[tensor]
        if not receivers or not nbytes:
            continue
        if len(cell.holders) != 1:  # the sender is a choice; the receipts are not
            if point_to_point:
                for r in receivers:
                    dev_in[r] += nbytes
            continue
        (root,) = cell.holders
        if point_to_point:
            for r in receivers:
                send(root, r, nbytes)
            continue
        by_host: dict[int, list[int]] = {}
        for r in receivers:
            by_host.setdefault(host[r], []).append(r)
        for h, members in by_host.items():
            if h == host[root] or len(members) == 1:  # whole, down a chain or sent
                send(root, members[0], nbytes)
                for m in members[1:]:
                    dev_in[m] += nbytes
                continue
            item = itemsizes[tensor]
            for m, piece in zip(members, split_box(cell.box, len(members))):
                if box_size(piece):
                    send(root, m, box_size(piece) * item)
            share = nbytes * (len(members) - 1) / len(members)  # the all-gather's
            for m in members:
                dev_in[m] += share
                dev_out[m] += share
    for kind, part in ((DEV_OUT, dev_out), (DEV_IN, dev_in), (NIC_OUT, nic_out),
                       (NIC_IN, nic_in)):
        for i, b in part.items():
            load[(kind, i)] += b
    worst = max((b / capacity(res, cluster) for res, b in load.items()), default=0.0)
    return worst * (1 - FLOOR_MARGIN)


__all__ = ["FLOOR_MARGIN", "baseline_floor"]

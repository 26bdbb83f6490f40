"""Cost model and lower bound.

Cost model (alpha-beta with contention): the plan's tasks run as a fluid simulation.
A task starts when each of its devices has finished its tasks of earlier steps (a
step is a group whose tasks run concurrently), spends a latency, then moves its bytes
through every resource on its path: the NIC it leaves a host by and the one it enters
the next host by (one direction each), the intra-host link of each device it leaves
and enters, or a device's copy engine, and a cluster's shared bandwidth if it has one
(``Cluster.shared_bandwidth``: one machine's cores). Concurrent tasks share a resource max-min
fairly. A broadcast is a pipelined chain root -> receivers
(each host boundary crossed once) or a pipelined tree (its latency: the deepest
path's); an all-gather is a ring (each member receives
(k-1)/k of the box); a reduction is the reverse chain; an all-reduce a ring (each
member sends and receives 2(k-1)/k of the box).

Lower bound: no plan is faster than the largest of: the bytes a host must receive that
none of its devices holds, over its NIC bandwidth; the bytes leaving a set of hosts
that alone hold some slices needed elsewhere, over their NICs; the bytes a device must
receive that it does not hold, over its link; the bytes all devices must receive that
they do not hold, over the shared bandwidth (if any); the bytes a host's devices must
take in, over their links and the host's NICs (a sum's addends merged elsewhere leave
through those); plus one latency. A partial sum of two or more addends is held by no
device (an addend holds a part of it) and by a host only if one whole group of its
addends lies inside it; summing ``k`` addends takes ``k - 1`` moves of each element, on
a host holding a whole group: a reduce-scatter over one host's eight GPUs is bound by
7/8 of the tensor over their links (NCCL's bus bandwidth), not by the 1/8 each receives.
A host's intake pays its hops (:func:`ingress_time`): merging addends and spreading a
byte to the host's other devices are hops, and a byte that skips one crosses the NICs
once per addend or once per device needing it. Where the cluster prices casts on the
wire (``Cluster.cast_bandwidth``), the source bytes held only by a set of devices are
converted by those devices, each at that rate, before they leave: no plan is faster
than that either (:meth:`_Intake._conversions`).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Sequence

import numpy as np

from reshard.cluster import Cluster, pipeline_piece
from reshard.dtypes import itemsize
from reshard.layout import box_size
from reshard.planner.cells.decompose import (
    TABLE_FROM,
    Cell,
    CellTable,
    decompose,
    decompose_table,
    devices_by_box,
)
from reshard.planner.costing.casts import conversion_seconds, converts
from reshard.planner.costing.fairshare import FairShare, Path
from reshard.planner.costing.fluid import Estimate, simulate
from reshard.planner.costing.stepgate import StepGate
from reshard.planner.schedule.coalesce import followers
from reshard.planner.values.plan_view import PlanView, Route
from reshard.planner.values.resources import (
    COPY,
    DEV_IN,
    DEV_OUT,
    NIC_IN,
    NIC_OUT,
    SHARED,
    Resource,
    capacities,
    code,
)
from reshard.planner.values.tasks import Conversion, Task, TaskKind, TensorSpec

Hop = tuple[tuple[tuple[Resource, float], ...], float, float, tuple[int, ...]]
"""What one (sender, receiver) edge of a transfer crosses (:func:`_hop`)."""

Hops = dict[tuple[int, int], Hop]
"""Hops by edge: the routes of one plan share them (a broadcast tree's edges recur
across its tasks)."""


def task_path(task: Task, cluster: Cluster, hops: Hops | None = None, *,
              rides: bool = False) -> Route:
    """Resources a task's bytes cross (with the fraction of the bytes on each) and its
    fixed latency. ``hops``: edges already looked at on ``cluster`` (filled in).
    ``rides``: the task travels in another task's coalesced message
    (:func:`reshard.planner.schedule.coalesce.followers`), so it adds no message of its
    own (``Cluster.message_cost``), only a part of that message at each end
    (``Cluster.part_cost``)."""
    path, lat = _links_path(task, cluster, {} if hops is None else hops)
    if cluster.shared_bandwidth and task.kind is not TaskKind.COPY:
        path = list(path)  # its codes, if any, would miss the shared resource
        # every byte a device receives crosses the shared resource once, and each end
        # of each message takes its fixed share of it (as bytes of this task)
        received = sum(f for (kind, _), f in path if kind == DEV_IN)
        if cluster.message_cost and task.nbytes and not rides:
            received += (2 * messages(task, cluster) * cluster.message_cost
                         * cluster.shared_bandwidth / task.nbytes)
        if cluster.part_cost and task.nbytes and rides:
            received += (2 * len(task.edges()) * cluster.part_cost
                         * cluster.shared_bandwidth / task.nbytes)
        if cluster.message_cost and task.kind is TaskKind.ALLGATHER:
            # the same cores stage its rows: each member copies the box once (its piece
            # into the rows, the others' out of them), before and after the exchange
            received += len(task.receivers) * cluster.shared_bandwidth / cluster.copy_bandwidth
        path.append(((SHARED, 0), received))
    return path, lat


def _pieces(nbytes: int, cluster: Cluster) -> int:
    """Messages one edge's ``nbytes`` take: a backend that pipelines cuts them in
    :func:`~reshard.cluster.pipeline_piece` pieces (one message when it is 0)."""
    piece = pipeline_piece(cluster.relay_piece, nbytes)
    return max(1, -(-nbytes // piece)) if piece else 1


def messages(task: Task, cluster: Cluster) -> int:
    """Messages ``task`` sends (each has two ends, a sender's and a receiver's): a
    piece of a pipelined transfer per edge (:func:`_pieces`); an all-gather's member
    piece to each other member; an all-reduce's ring (the backend's own: each member
    sends ``2(k - 1)`` times); none for a copy. What ``Cluster.message_cost`` charges."""
    k = len(task.receivers)
    if task.kind is TaskKind.COPY:
        return 0
    if task.kind is TaskKind.ALLGATHER:
        return k * (k - 1) * _pieces(task.nbytes // max(k, 1), cluster)
    if task.kind is TaskKind.ALLREDUCE:
        return 2 * k * (k - 1)
    edges = k if task.kind is TaskKind.REDUCE else len(task.edges()) + len(task.addends)
    return edges * _pieces(task.nbytes, cluster)


def _hop(a: int, b: int, cluster: Cluster) -> Hop:
    """The edge ``a -> b``: the resources every byte crosses, the hop's latency, the
    rate a relay passes a piece on at (over the NICs where the hop leaves the host,
    else over the device's link), and the resources' codes (:func:`~reshard.planner.
    values.resources.code`)."""
    host = cluster.host_map
    if host[a] == host[b]:
        crossed: tuple[tuple[Resource, float], ...] = (((DEV_OUT, a), 1.0),
                                                       ((DEV_IN, b), 1.0))
        return crossed, cluster.intra_latency, cluster.intra_bandwidth, \
            tuple(code(r) for r, _ in crossed)
    nic = cluster.nic_map
    crossed = (((DEV_OUT, a), 1.0), ((DEV_IN, b), 1.0), ((NIC_OUT, nic[a]), 1.0),
               ((NIC_IN, nic[b]), 1.0))
    return crossed, cluster.latency, cluster.nic_capacity, tuple(code(r) for r, _ in crossed)


def _links_path(task: Task, cluster: Cluster, hops: Hops
                ) -> Route:
    """:func:`task_path` without the cluster's shared bandwidth."""
    if task.kind is TaskKind.COPY:
        return [((COPY, task.root), 1.0)], 0.0
    if task.kind is TaskKind.ALLGATHER:
        k = len(task.receivers)
        frac = (k - 1) / k if k else 0.0
        path: list[tuple[Resource, float]] = []
        for d in task.receivers:
            path += [((DEV_IN, d), frac), ((DEV_OUT, d), frac)]
        hosts = {cluster.host_of(d) for d in task.receivers}
        if len(hosts) > 1:
            for d in task.receivers:
                path += [((NIC_IN, cluster.nic_of(d)), frac),
                         ((NIC_OUT, cluster.nic_of(d)), frac)]
        lat = cluster.latency * (len(hosts) - 1) + cluster.intra_latency * (k - len(hosts))
        return path, lat
    if task.kind is TaskKind.ALLREDUCE:
        return _ring_path(task, cluster)
    if task.kind is TaskKind.SEND:  # one edge: its hop alone (an all-to-all's every task)
        edge = (task.root, task.receivers[0])
        hop = hops.get(edge)
        if hop is None:
            hop = hops[edge] = _hop(*edge, cluster)
        return Path(hop[0], hop[3]), hop[1]
    if task.kind is TaskKind.REDUCE:
        chain = [*task.receivers, task.root]
        edges: Sequence[tuple[int, int]] = list(itertools.pairwise(chain))
    else:  # a fused reduction's addends first pass their running sums to the root
        edges = [*task.sum_edges(), *task.edges()] if task.addends else task.edges()
    # Each edge carries every byte (a sender with k children sends them k times); the
    # pipelined pieces reach a device after the latencies of its slowest path in, and
    # after each relay (a sender that received the bytes itself) held a whole piece of
    # them for each child it feeds (Cluster.relay_piece; 0: no such fill). A device
    # summing what several send it starts when the last of them reaches it.
    hops_path = Path()
    codes: list[int] = []
    reach: dict[int, float] = {}
    received: set[int] = set()
    piece = pipeline_piece(cluster.relay_piece, task.nbytes)
    children = collections.Counter(a for a, _ in edges) if piece else None
    for edge in edges:
        hop = hops.get(edge)
        if hop is None:
            hop = hops[edge] = _hop(*edge, cluster)
        crossed, wait, rate, hop_codes = hop
        hops_path.extend(crossed)
        codes.extend(hop_codes)
        a, b = edge
        at = reach.get(a, 0.0) + wait
        if children is not None and a in received:
            at += children[a] * piece / rate
        if at > reach.get(b, 0.0):
            reach[b] = at
        else:
            reach.setdefault(b, 0.0)
        received.add(b)
    hops_path.codes = codes  # every hop's bytes whole
    return hops_path, max(reach.values())


def _ring_path(task: Task, cluster: Cluster) -> Route:
    """An all-reduce as a ring over its members in device order (NCCL's and gloo's): a
    reduce-scatter then an all-gather, each member sending and receiving 2(k-1)/k of
    the box (over the NICs where the ring crosses hosts), after 2(k-1) hops."""
    ring = sorted(task.receivers)
    k = len(ring)
    frac = 2 * (k - 1) / k
    host, nic = cluster.host_map, cluster.nic_map
    path: list[tuple[Resource, float]] = []
    worst = cluster.intra_latency
    for a, b in zip(ring, ring[1:] + ring[:1]):
        path += [((DEV_OUT, a), frac), ((DEV_IN, b), frac)]
        if host[a] != host[b]:
            path += [((NIC_OUT, nic[a]), frac), ((NIC_IN, nic[b]), frac)]
            worst = max(worst, cluster.latency)
    return path, worst * 2 * (k - 1)


Routes = dict[tuple[object, ...], Route]
"""Task routes by what decides them (:func:`task_routes`' ``known``)."""


def task_routes(tasks: Sequence[Task], cluster: Cluster, known: Routes | None = None,
                tensors: Sequence[Conversion] = ()) -> tuple[Route, ...]:
    """:func:`task_path` of every task; tasks of one route (other tensors, steps or
    boxes, the same devices in the same roles) share one (read only). ``known``: the
    routes of other tasks on ``cluster`` (filled in as they are found), so that plans
    of the same tasks in other orders or steps find each route once. ``tensors``: the
    plan's, where the cluster charges messages (``Cluster.message_cost``): the tasks
    that ride in another's coalesced message add none, only a part of it
    (``Cluster.part_cost``)."""
    if known is None:
        known = {}
    piece = cluster.relay_piece
    per_message = bool((cluster.message_cost or cluster.part_cost)
                       and cluster.shared_bandwidth)
    riders = followers(tasks, tensors) if per_message and tensors else set()
    hops: Hops = {}
    out = []
    for i, t in enumerate(tasks):
        rides = i in riders
        key = (t.kind, t.root, t.receivers, t.parents, t.addends, t.addend_parents,
               pipeline_piece(piece, t.nbytes), t.nbytes if per_message else 0, rides)
        got = known.get(key)
        if got is None:
            path, lat = task_path(t, cluster, hops, rides=rides)
            got = known[key] = (path if isinstance(path, Path) else Path(path), lat)
        out.append(got)
    return tuple(out)


def stepped_floor(plan: PlanView) -> float:
    """Seconds the cost model cannot predict below for ``plan``, from its steps alone,
    without simulating the sharing (a bound on :func:`simulate`, cheaper by far).

    The model runs a device's steps in order, and every task of a device's step lies
    inside that device's window for the step (it starts after the device entered the
    step, which ends when the task has). So a window lasts at least the least latency of
    its tasks plus, for each resource of the device (its links, its copy engine, its
    NIC where the device is alone on it), the bytes its step's tasks put there over the
    resource's capacity; and a task ends no earlier than its latency plus its bytes over
    its slowest resource after the last of its devices entered its step. Run through the
    steps in order, those give each device's earliest exit; the latest is the floor.
    Resources other devices share (a NIC of several devices, the shared bandwidth) add
    to the tasks' own times only, so the floor stays below the model's prediction.
    """
    tasks = plan.tasks
    n = len(tasks)
    if not n:
        return 0.0
    routes = plan.routes()
    flows = FairShare([p for p, _ in routes], plan.cluster)
    lat = plan.latencies()
    nbytes = np.array([float(t.nbytes) for t in tasks])
    seconds = flows.frac * nbytes[flows.task] / flows.capacity[flows.res]  # per edge
    alone = np.zeros(n)
    np.maximum.at(alone, flows.task, seconds)
    alone += lat
    step = np.array([t.step for t in tasks], dtype=np.int64)
    gate = StepGate(tasks)
    member_task, member_dev = gate.member_task, gate.member_dev
    pair_step, pair_dev, window = _step_windows(flows, _owners(plan.cluster, flows), step,
                                                gate, seconds, lat)
    exit_at = np.zeros(int(max(member_dev.max(initial=0), pair_dev.max(initial=0))) + 1)
    member_step = step[member_task]
    for s in np.unique(step):  # each device's exit from the last step it ran
        m = member_step == s
        who, dev = member_task[m], member_dev[m]
        start = np.zeros(n)
        np.maximum.at(start, who, exit_at[dev])
        ends = start[who] + alone[who]
        leave = exit_at.copy()
        np.maximum.at(leave, dev, ends)
        here = pair_step == s
        d = pair_dev[here]
        leave[d] = np.maximum(leave[d], exit_at[d] + window[here])
        exit_at = leave
    return float(exit_at.max())


def _owners(cluster: Cluster, flows: FairShare) -> np.ndarray:
    """Per resource of ``flows``, the device whose step window bounds its load: a
    device's links and copy engine, a NIC that device alone uses (-1: none alone)."""
    nic_devices = collections.Counter(cluster.nic_map.values())
    nic_device = {nic: d for d, nic in cluster.nic_map.items() if nic_devices[nic] == 1}

    def owned_by(res: Resource) -> int:
        kind, i = res
        if kind in (DEV_IN, DEV_OUT, COPY):
            return i
        return nic_device.get(i, -1) if kind in (NIC_IN, NIC_OUT) else -1

    return np.array([owned_by(r) for r in flows.resources] or [-1], dtype=np.int64)


def _step_windows(flows: FairShare, owner: np.ndarray, step: np.ndarray, gate: StepGate,
                  seconds: np.ndarray, lat: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (step, device) that has tasks: the step, the device, and the least its window
    lasts: the least latency of its tasks there plus its busiest own resource's
    seconds (``seconds``: per edge of ``flows``)."""
    member_task, member_dev = gate.member_task, gate.member_dev
    ndev = int(max(member_dev.max(initial=0), owner.max())) + 1
    nres = len(flows.resources)
    mine = owner[flows.res] >= 0
    key = (step[flows.task[mine]] * ndev + owner[flows.res[mine]]) * nres + flows.res[mine]
    keys, at = np.unique(key, return_inverse=True)
    busy = np.bincount(at, weights=seconds[mine], minlength=len(keys))
    pairs, pair_at = np.unique(np.concatenate([keys // nres,
                                               step[member_task] * ndev + member_dev]),
                               return_inverse=True)
    window = np.zeros(len(pairs))
    np.maximum.at(window, pair_at[:len(keys)], busy)
    least = np.full(len(pairs), np.inf)
    np.minimum.at(least, pair_at[len(keys):], lat[member_task])
    window += np.where(np.isfinite(least), least, 0.0)
    return pairs // ndev, pairs % ndev, window


def one_at_a_time_time(plan: PlanView) -> float:
    """Seconds no plan of ``plan``'s tasks that runs each device's tasks one at a time
    can beat: per device, the sum over its tasks of each one's latency and its bytes
    over the slowest resource on its path (each task alone, at best), and of the
    conversions it makes for casts on the wire (each before its own task's bytes)."""
    cap = capacities(plan.cluster)
    busy = conversion_seconds(plan)
    slowest: dict[int, float] = {}  # by id of a shared path
    for t, (path, lat) in zip(plan.tasks, plan.routes()):
        per_byte = slowest.get(id(path))
        if per_byte is None:
            per_byte = slowest[id(path)] = max(
                (f / cap[r[0]] for r, f in path if f > 0), default=0.0)
        seconds = lat + per_byte * t.nbytes
        for d in set(t.devices):
            busy[d] = busy.get(d, 0.0) + seconds
    return max(busy.values(), default=0.0)


def ingress_time(busy: float, addends: int, needers: int, hop: float) -> float:
    """Least seconds after the first byte can arrive for a host to take in bytes that
    keep its NICs ``busy`` seconds, when each is a sum of at least ``addends`` values
    held outside it and needed by at least ``needers`` of its devices, and a hop
    between two devices costs ``hop`` seconds.

    Merging two addends is a hop, so in the first ``hop`` seconds only raw addends
    arrive: an element then costs ``addends`` crossings. Spreading a byte to another
    device is a hop, so in the last ``hop`` seconds a byte reaches only the device it
    enters by: it costs ``needers`` crossings. In between each byte crosses once (the
    host takes it in, merged, then spreads it). The time to take in ``busy`` seconds'
    worth of bytes at those costs (both in a window of both): the bytes done by
    ``tau`` after the first arrival are ``tau / (k g)`` up to ``hop``, then up to
    ``2 hop`` ``hop / (k g) + (tau - hop) (1 / k + 1 / g - 1 / (k g))``, then one per
    second. With one addend and one needer it is ``busy``.
    """
    k, g = max(1, addends), max(1, needers)
    if hop <= 0 or (k == 1 and g == 1):
        return busy
    first = hop / (k * g)  # done by tau = hop
    second = hop / k + hop / g  # done by tau = 2 hop
    if busy <= first:
        return busy * k * g
    if busy <= second:
        return hop + (busy - first) * hop / (second - first)
    return 2 * hop + busy - second


def _cell_groups(t: TensorSpec, cells: list[Cell] | CellTable | None = None
                 ) -> dict[tuple[frozenset[int], frozenset[int]], int]:
    """Elements of tensor ``t`` by (holders, needers): its unit slices' boxes summed
    per pair of device sets (what every term of the bound depends on). ``cells``: its
    source's cells as the planner cut them (a plain source's: the same decomposition),
    else found here."""
    out: dict[tuple[frozenset[int], frozenset[int]], int] = {}
    if cells is None:
        holders = devices_by_box(t.src, t.shape)
        needers = devices_by_box(t.dst, t.shape, t.dst.partial_leaders())
        if len(holders) * len(needers) >= TABLE_FROM:
            cells = decompose_table(t.shape, holders, needers)
        else:
            cells = decompose(t.shape, holders, needers)
    if isinstance(cells, CellTable):
        table = cells
        for h, n, size in zip(table.holder.tolist(), table.needer.tolist(),
                              table.size.tolist()):
            key = (table.holder_sets[h], table.needer_sets[n])
            out[key] = out.get(key, 0) + size
        return out
    for c in cells:
        key = (frozenset(c.holders), frozenset(c.needers))
        out[key] = out.get(key, 0) + box_size(c.box)
    return out


def lower_bound(tensors: Sequence[TensorSpec], cluster: Cluster,
                cells: Sequence[list[Cell] | CellTable | None] | None = None) -> float:
    """Seconds no plan moving ``tensors`` can beat on ``cluster``. ``cells``: per
    tensor, its plain source's cells as the planner cut them (None: found here)."""
    intake = _Intake(cluster)
    for i, t in enumerate(tensors):
        intake.add(t, None if cells is None else cells[i])
    return intake.bound()


_SUBSET_SETS = 256
"""Holder sets of converted bytes up to which the bound's conversion term also gives
each set the bytes of its subsets (quadratic in the sets)."""


class _Intake:
    """What the lower bound's terms count, tensor by tensor: the bytes each host and
    device must take in, copy, or send out (module docstring)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.host_in: dict[int, float] = {}
        self.dev_in: dict[int, float] = {}
        self.dev_copy: dict[int, float] = {}
        self.leave: dict[frozenset[int], list[tuple[frozenset[int], float]]] = {}
        # bytes a host's devices must take in (or its NICs send out, for sums merged
        # elsewhere), and the extra moves every merge of a sum costs (for the shared term)
        self.host_take: dict[int, float] = {}
        # per host: the fewest addends and the fewest of its needers any byte it takes in
        # has (the cost of skipping the merge before, or the spread after, the NIC)
        self.host_least: dict[int, tuple[int, int]] = {}
        self.merged = 0.0
        self.near: set[int] = set()  # devices some of whose bytes may come from their own host
        self.sums_to: set[int] = set()  # devices needing a sum (an all-reduce may bring it)
        # where messages cost (Cluster.message_cost, on a shared bandwidth): each
        # device's holder sets
        self.roots: dict[int, set[frozenset[int]]] | None = \
            {} if cluster.message_cost and cluster.shared_bandwidth else None
        self.host_of = cluster.host_map.__getitem__  # a plain lookup: a hot loop
        # source bytes a cast on the wire converts, by the devices holding them (where
        # the cluster prices conversions: Cluster.cast_bandwidth)
        self.convert: dict[frozenset[int], float] = {}

    def add(self, t: TensorSpec, cells: list[Cell] | CellTable | None = None) -> None:
        """Count tensor ``t``'s cells (``cells``: :func:`_cell_groups`')."""
        host_of = self.host_of
        # A partial source whose groups have two or more addends is a sum no device
        # holds: a needer receives every element of it at least once (from another
        # addend, or the sum), so it counts as received even by an addend; a host
        # holds it only if one whole group lies inside it.
        groups = t.src.partial_groups() if t.src.spec.partial else []
        summed = any(len(g) > 1 for g in groups)
        # each addend's group, and the one host holding all of it (None: several)
        sum_host: dict[int, int | None] = {}
        for g in groups:
            hosts = {host_of(d) for d in g}
            one = next(iter(hosts)) if len(hosts) == 1 else None
            for d in g:
                sum_host[d] = one
        size = min((len(g) for g in groups), default=1)  # addends per group
        item = t.itemsize
        # a needed element is converted by one of its holders (a partial sum's, where it
        # lands: neither the model nor the bound prices that)
        src_item = itemsize(t.dtype) if self.cluster.cast_bandwidth and converts(t) \
            and not t.src.spec.partial else 0
        for (holders, needers), elements in _cell_groups(t, cells).items():
            if src_item:
                self.convert[holders] = self.convert.get(holders, 0.0) + elements * src_item
            if not summed and len(holders) == 1 and len(needers) == 1:
                self._pair(next(iter(holders)), next(iter(needers)), elements * item)
                continue
            # the hosts holding a whole group of the cell's addends (None: a group
            # spread over hosts)
            inside: set[int | None] = {sum_host[d] for d in holders} if summed else set()
            self._cell(holders, needers, elements * item, size if summed else 0, inside)

    def _pair(self, s: int, d: int, nbytes: float) -> None:
        """:meth:`_cell` of a cell group one device holds and one needs (an all-to-all's
        every cell): the same counts without building its sets."""
        if s == d:
            self.dev_copy[d] = self.dev_copy.get(d, 0.0) + nbytes
            return
        hs, hd = self.host_of(s), self.host_of(d)
        if hs != hd:
            self.host_in[hd] = self.host_in.get(hd, 0.0) + nbytes
            self.host_least[hd] = (1, 1)  # one holder, one needer: the least there is
        self.dev_in[d] = self.dev_in.get(d, 0.0) + nbytes
        self.host_take[hd] = self.host_take.get(hd, 0.0) + nbytes
        if self.roots is not None:
            self.roots.setdefault(d, set()).add(frozenset((s,)))
        if hs == hd:
            self.near.add(d)
        else:
            self.leave.setdefault(frozenset((hs,)), []).append((frozenset((hd,)), nbytes))

    def _cell(self, holders: frozenset[int], needers: frozenset[int], nbytes: float,
              size: int, inside: set[int | None]) -> None:
        """Count one cell group's ``nbytes`` (after any cast: what the wire carries);
        ``size``: addends per group of a summed source (0: not a sum)."""
        host_of, summed = self.host_of, size > 0
        hold_hosts = frozenset(host_of(d) for d in holders)
        need_hosts = {host_of(d) for d in needers}
        summing = {h for h in inside if h is not None} if summed else hold_hosts
        per_host: dict[int, int] = {}  # needers per host, counted once (not per host)
        for d in needers:
            h = host_of(d)
            per_host[h] = per_host.get(h, 0) + 1
        for h in need_hosts - summing:
            self.host_in[h] = self.host_in.get(h, 0.0) + nbytes
            # an addend inside h may merge there without crossing its NICs
            adds = size if summed and h not in hold_hosts else 1
            spread = per_host[h]
            least = self.host_least.get(h, (adds, spread))
            self.host_least[h] = (min(least[0], adds), min(least[1], spread))
        for d in needers:
            if d in holders and not summed:
                self.dev_copy[d] = self.dev_copy.get(d, 0.0) + nbytes
            else:
                self.dev_in[d] = self.dev_in.get(d, 0.0) + nbytes
                self.host_take[host_of(d)] = self.host_take.get(host_of(d), 0.0) + nbytes
                if summed:
                    self.sums_to.add(d)
                elif self.roots is not None:
                    self.roots.setdefault(d, set()).add(frozenset(holders))
                if host_of(d) in summing:
                    self.near.add(d)
        if summed and needers:
            # Summing ``size`` addends takes size - 1 moves of each element (each
            # merges two partial values on one device) and every needer but the
            # one holding the sum receives it: size - 2 moves beyond the needers'.
            self.merged += (size - 2) * nbytes
            one = next(iter(inside)) if len(inside) == 1 else None
            if one is not None:
                # every group in one host: each merge lands on one of its devices or
                # needs an addend to leave it through its NICs, and its needers'
                # receipts above count one too many when the sum ends on one of them
                local = sum(1 for d in needers if host_of(d) == one)
                self.host_take[one] = self.host_take.get(one, 0.0) + nbytes * (
                    size - 1 - (1 if local else 0))
        if need_hosts - hold_hosts:
            self.leave.setdefault(hold_hosts, []).append((frozenset(need_hosts), nbytes))

    def fewest_messages(self) -> int:
        """Messages the devices must receive at the least, each device the more of:
        its bytes ``b`` in pieces of ``pipeline_piece(relay_piece, b)`` (no message of
        a send, a broadcast or an all-gather into it carries more: its pieces are of a
        transfer of at most ``b`` bytes, :func:`messages`; one for a device needing a
        sum, whose all-reduce's ring messages are of any size, or without a piece size);
        and its cells' holder sets that share no device (a message carries the boxes
        of one cell group, or of several with one root, which their holder sets share:
        a greedy pick of disjoint sets, the smallest first, counts some of them)."""
        roots = self.roots or {}
        total = 0
        for d, b in self.dev_in.items():
            least = 1 if d in self.sums_to else _pieces(int(b), self.cluster)
            taken: set[int] = set()
            disjoint = 0
            for hs in sorted(roots.get(d, ()), key=len):
                if taken.isdisjoint(hs):
                    taken |= hs
                    disjoint += 1
            total += max(least, disjoint)
        return total

    def bound(self) -> float:
        """The largest term. Each is bytes over a bandwidth plus the least latency its
        bytes may pay: bytes that must cross a host boundary one network latency,
        bytes a device may receive from its own host (or a host's merges) one
        intra-host latency."""
        cluster = self.cluster
        lat, intra = cluster.latency, min(cluster.latency, cluster.intra_latency)
        terms = [0.0]
        terms += [lat + ingress_time(b / cluster.nic_bandwidth, *self.host_least[h], intra)
                  for h, b in self.host_in.items()]
        terms += [b / cluster.intra_bandwidth + (intra if d in self.near else lat)
                  for d, b in self.dev_in.items()]
        terms += [b / cluster.copy_bandwidth for b in self.dev_copy.values()]
        if cluster.shared_bandwidth and self.dev_in:
            terms.append((sum(self.dev_in.values()) + self.merged) / cluster.shared_bandwidth
                         + (2 * cluster.message_cost * self.fewest_messages()
                            if cluster.message_cost else 0.0) + intra)
        # A host takes its bytes in through its devices' links, or sends a sum's addends
        # out through its NICs to be merged elsewhere.
        for h, b in self.host_take.items():
            terms.append(b / (len(cluster.hosts[h]) * cluster.intra_bandwidth
                              + cluster.nic_bandwidth) + intra)
        # Slices held only inside a host set S and needed outside it leave through S's
        # NICs.
        for s in self.leave:
            out = sum(nb for hs, items in self.leave.items() if hs <= s
                      for need, nb in items if not need <= s)
            terms.append(out / (len(s) * cluster.nic_bandwidth) + lat)
        terms += self._conversions()
        return max(terms)

    def _conversions(self) -> list[float]:
        """Seconds of converting: the source bytes of a cast held only by a device set
        are converted by its devices, each at ``cast_bandwidth`` (a device converts what
        it sends before its step's transfers go, so the plan lasts at least its own
        conversions): per set of holders (with the bytes of its subsets, up to
        :data:`_SUBSET_SETS` sets), and all of them over every holder."""
        if not self.convert:
            return []
        rate = self.cluster.cast_bandwidth
        sets = list(self.convert.items())
        if len(sets) <= _SUBSET_SETS:
            terms = [sum(b for hs, b in sets if hs <= s) / (len(s) * rate) for s, _ in sets]
        else:
            terms = [b / (len(s) * rate) for s, b in sets]
        holders = frozenset().union(*self.convert)
        terms.append(sum(self.convert.values()) / (len(holders) * rate))
        return terms


__all__ = [
    "Estimate",
    "Hops",
    "Routes",
    "ingress_time",
    "lower_bound",
    "messages",
    "one_at_a_time_time",
    "simulate",
    "stepped_floor",
    "task_path",
    "task_routes",
]

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

The lower bound no plan beats is :mod:`reshard.planner.costing.bound`'s.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Sequence

import numpy as np

from reshard.cluster import Cluster, pipeline_piece
from reshard.planner.costing.casts import conversion_seconds
from reshard.planner.costing.fairshare import Path, path_arrays
from reshard.planner.costing.fluid import Estimate, simulate
from reshard.planner.costing.hop_batch import batch_routes, edge_lists
from reshard.planner.costing.hops import SHIFT_HOSTS, Hop, Hops
from reshard.planner.costing.relabel_many import (
    RELABEL_TRIAL,
    Tried,
    relabeled_many,
    relabeled_or_own,
)
from reshard.planner.costing.route_forms import (
    read_only_ones,
    shifted,
    shifted_many,
)
from reshard.planner.costing.route_keys import route_key, route_keys
from reshard.planner.costing.step_floor import stepped_floor
from reshard.planner.costing.tree_reach import by_levels
from reshard.planner.schedule.coalesce import followers
from reshard.planner.values.plan_view import PlanView, Route
from reshard.planner.values.resources import (
    COPY,
    DEV_IN,
    DEV_OUT,
    KIND_CODE,
    KINDS,
    NIC_IN,
    NIC_OUT,
    SHARED,
    Resource,
    capacities,
)
from reshard.planner.values.tasks import Conversion, Task, TaskKind


def task_path(task: Task, cluster: Cluster, hops: Hops | None = None, *,
              rides: bool = False) -> Route:
    """Resources a task's bytes cross (with the fraction of the bytes on each) and its
    fixed latency. ``hops``: edges already looked at on ``cluster`` (filled in).
    ``rides``: the task travels in another task's coalesced message
    (:func:`reshard.planner.schedule.coalesce.followers`), so it adds no message of its
    own (``Cluster.message_cost``), only a part of that message at each end
    (``Cluster.part_cost``)."""
    path, lat = _links_path(task, cluster, Hops() if hops is None else hops)
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


def edge_pieces(nbytes: int, cluster: Cluster) -> int:
    """Messages one edge's ``nbytes`` take: a backend that pipelines cuts them in
    :func:`~reshard.cluster.pipeline_piece` pieces (one message when it is 0)."""
    piece = pipeline_piece(cluster.relay_piece, nbytes)
    return max(1, -(-nbytes // piece)) if piece else 1


def messages(task: Task, cluster: Cluster) -> int:
    """Messages ``task`` sends (each has two ends, a sender's and a receiver's): a
    piece of a pipelined transfer per edge (:func:`edge_pieces`); an all-gather's member
    piece to each other member; an all-reduce's ring (the backend's own: each member
    sends ``2(k - 1)`` times); none for a copy. What ``Cluster.message_cost`` charges."""
    k = len(task.receivers)
    if task.kind is TaskKind.COPY:
        return 0
    if task.kind is TaskKind.ALLGATHER:
        return k * (k - 1) * edge_pieces(task.nbytes // max(k, 1), cluster)
    if task.kind is TaskKind.ALLREDUCE:
        return 2 * k * (k - 1)
    edges = k if task.kind is TaskKind.REDUCE else len(task.edges()) + len(task.addends)
    return edges * edge_pieces(task.nbytes, cluster)


def _hop(a: int, b: int, cluster: Cluster) -> Hop:
    """The edge ``a -> b``: the resources every byte crosses, the hop's latency, the
    rate a relay passes a piece on at (over the NICs where the hop leaves the host,
    else over the device's link), and the resources' codes (:func:`~reshard.planner.
    values.resources.code`): :func:`_hops_on`'s."""
    return _hops_on(cluster)(a, b)


def _hops_on(cluster: Cluster) -> Callable[[int, int], Hop]:
    """:func:`_hop` on ``cluster``, its maps, latencies and capacities read once (the
    NIC capacity is a property): for many edges of one call."""
    host, nic = cluster.host_map, cluster.nic_map
    out_in = KIND_CODE[DEV_OUT], KIND_CODE[DEV_IN], KIND_CODE[NIC_OUT], KIND_CODE[NIC_IN]
    intra = cluster.intra_latency, cluster.intra_bandwidth
    inter = cluster.latency, cluster.nic_capacity

    def hop(a: int, b: int) -> Hop:
        ends = (a * 8 + out_in[0], b * 8 + out_in[1])  # code() of each
        if host[a] == host[b]:
            crossed: tuple[tuple[Resource, float], ...] = (((DEV_OUT, a), 1.0),
                                                           ((DEV_IN, b), 1.0))
            return crossed, *intra, ends
        crossed = (((DEV_OUT, a), 1.0), ((DEV_IN, b), 1.0), ((NIC_OUT, nic[a]), 1.0),
                   ((NIC_IN, nic[b]), 1.0))
        return crossed, *inter, (*ends, nic[a] * 8 + out_in[2], nic[b] * 8 + out_in[3])

    return hop


def _send_route(task: Task, cluster: Cluster, hops: Hops) -> tuple[Path, float]:
    """A send's route without shared bandwidth: its one edge's hop (read from ``hops``,
    found and kept there once)."""
    edge = (task.root, task.receivers[0])
    hop = hops.get(edge)
    if hop is None:
        hop = hops[edge] = _hop(*edge, cluster)
    return Path(hop[0], hop[3]), hop[1]


def _send_batch(items: list[tuple[tuple[object, ...], Task]], cluster: Cluster, hops: Hops,
                found: Found) -> None:
    """Put in ``found`` (by place in ``items``) the route of each send of ``items``
    on a cluster without shared bandwidth: :func:`_send_route`'s, its one edge's hop
    (read from ``hops``, or found by :func:`_hops_on` and kept there), in one loop."""
    get, send, hop_of = hops.get, TaskKind.SEND, _hops_on(cluster)
    for slot, (_, t) in enumerate(items):
        if t.kind is not send:
            continue
        edge = (t.root, t.receivers[0])
        hop = get(edge)
        if hop is None:
            hop = hops[edge] = hop_of(*edge)
        found[slot] = Path(hop[0], hop[3]), hop[1]


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
        return _send_route(task, cluster, hops)
    senders, receivers = edge_lists(task)
    if len(senders) < ARRAY_EDGES:
        return _hops_path(list(zip(senders, receivers)), task, cluster, hops)
    return _edges_path(np.array(senders, dtype=np.int64), np.array(receivers, dtype=np.int64),
                       task, cluster, hops)


ARRAY_EDGES = 48
"""Edges from which a route is read as arrays (:func:`_edges_path`); fewer are read one
by one (:func:`_hops_path`: the same route, without the arrays' fixed cost)."""


def _hops_path(edges: Sequence[tuple[int, int]], task: Task, cluster: Cluster, hops: Hops
               ) -> Route:
    """:func:`_edges_path` of a few edges, edge by edge (each hop looked up once a plan
    in ``hops``)."""
    get, put = hops.get, hops.setdefault
    got = [get(e) or put(e, _hop(*e, cluster)) for e in edges]  # a hop is never empty
    hops_path = Path()
    hops_path.extend(itertools.chain.from_iterable([h[0] for h in got]))
    hops_path.codes = list(itertools.chain.from_iterable([h[3] for h in got]))  # bytes whole
    piece = pipeline_piece(cluster.relay_piece, task.nbytes)
    if not piece:
        return hops_path, _plain_reach(edges, [h[1] for h in got])
    reach: dict[int, float] = {}
    received: set[int] = set()
    children = collections.Counter(a for a, _ in edges)
    for (a, b), (_, wait, rate, _) in zip(edges, got):
        at = reach.get(a, 0.0) + wait
        if a in received:
            at += children[a] * piece / rate
        if at > reach.get(b, 0.0):
            reach[b] = at
        else:
            reach.setdefault(b, 0.0)
        received.add(b)
    return hops_path, max(reach.values())


def _plain_reach(edges: Sequence[tuple[int, int]], waits: Sequence[float]) -> float:
    """The latest a device of ``edges`` is reached, each edge's ``waits`` after its
    sender was (0 where it never was), edge by edge in order, without relay fills: the
    sums of :func:`_hops_path`'s loop (a device reached only at 0 adds nothing to the
    max, which is at least 0)."""
    reach: dict[int, float] = {}
    get = reach.get
    for (a, b), wait in zip(edges, waits):
        at = get(a, 0.0) + wait
        if at > get(b, 0.0):
            reach[b] = at
    return max(reach.values(), default=0.0)


def _edges_path(a: np.ndarray, b: np.ndarray, task: Task, cluster: Cluster, hops: Hops
                ) -> Route:
    """The route of ``task``'s edges ``a[i] -> b[i]`` in order (:func:`_hop` of each).

    Each edge carries every byte (a sender with k children sends them k times); the
    pipelined pieces reach a device after the latencies of its slowest path in, and
    after each relay (a sender that received the bytes itself) held a whole piece of
    them for each child it feeds (Cluster.relay_piece; 0: no such fill). A device
    summing what several send it starts when the last of them reaches it. The hops are
    read as arrays; the times summed edge by edge in order (as floats: the same sums)."""
    host, nic = hops.arrays(cluster)
    cross = host[a] != host[b]
    quad = np.empty((len(a), 4), dtype=np.int64)
    quad[:, 0] = a * 8 + KIND_CODE[DEV_OUT]
    quad[:, 1] = b * 8 + KIND_CODE[DEV_IN]
    quad[:, 2] = nic[a] * 8 + KIND_CODE[NIC_OUT]
    quad[:, 3] = nic[b] * 8 + KIND_CODE[NIC_IN]
    used = np.ones((len(a), 4), dtype=bool)
    used[:, 2] = used[:, 3] = cross
    wait = np.where(cross, cluster.latency, cluster.intra_latency)
    piece = pipeline_piece(cluster.relay_piece, task.nbytes)
    fill = None
    if piece:
        rate = np.where(cross, cluster.nic_capacity, cluster.intra_bandwidth)
        fill = np.bincount(a)[a] * piece / rate
    return Path.of_codes(quad[used]), _reach(a, b, wait, fill)


def _reach(a: np.ndarray, b: np.ndarray, wait: np.ndarray, fill: np.ndarray | None
           ) -> float:
    """The latest a device of the edges ``a[i] -> b[i]`` is reached: each edge's
    ``wait`` after its sender was, plus its ``fill`` where the sender received the
    bytes by an earlier edge (None: no fills), edge by edge in order."""
    n = len(a)
    if n and not _chain_breaks(a, b):
        # a chain of distinct devices from a root it never reaches: the running sum
        steps = np.zeros(2 * n)
        steps[0::2] = wait
        if fill is not None:
            steps[3::2] = fill[1:]
        return float(np.cumsum(steps).max())
    size = int(max(a.max(initial=0), b.max(initial=0))) + 1
    shallow = _reach_by_depth(a, b, wait, fill, size)
    if shallow is not None:
        return shallow
    reach = [0.0] * size
    got = [False] * size
    for s, r, w, f in zip(a.tolist(), b.tolist(), wait.tolist(),
                          [0.0] * n if fill is None else fill.tolist()):
        at = reach[s] + w
        if fill is not None and got[s]:
            at += f
        if at > reach[r]:  # noqa: PLR1730 (the float kept where equal, without a call)
            reach[r] = at
        got[r] = True
    ends: list[int] = b.tolist()
    return max(reach[r] for r in ends)


def _reach_by_depth(a: np.ndarray, b: np.ndarray, wait: np.ndarray,
                    fill: np.ndarray | None, size: int) -> float | None:
    """:func:`_reach` of a shallow tree, a depth at a time (:func:`~reshard.planner.
    costing.tree_reach.by_levels`: the same sums, each edge's after its sender's). None
    where a device is reached twice or the tree is deeper than ``len(a) // 32`` (then
    edge by edge is cheaper)."""
    return by_levels(a, b, wait, fill, size, len(a) // 32)


def _chain_breaks(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the edges ``a[i] -> b[i]`` are not one chain (each edge from the last
    one's receiver) through distinct devices that never return to its root."""
    if len(a) > 1 and not np.array_equal(a[1:], b[:-1]):
        return True
    seen = np.zeros(int(max(a.max(initial=0), b.max(initial=0))) + 1, dtype=np.int64)
    np.add.at(seen, b, 1)
    return bool(seen.max() > 1 or seen[a[0]] > 0)


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


RouteMemo = dict[tuple[object, ...], Route]
"""Task routes by what decides them (any dict; :class:`Routes` also keeps its hops)."""


class Routes(RouteMemo):
    """Task routes by what decides them (:func:`task_routes`' ``known``), and the
    :class:`Hops` they were found with (:func:`shared_hops`; ``None`` until one is)."""

    hops: Hops | None = None


def task_routes(tasks: Sequence[Task], cluster: Cluster,
                known: RouteMemo | None = None,
                tensors: Sequence[Conversion] = ()) -> tuple[Route, ...]:
    """:func:`task_path` of every task; tasks of one route (other tensors, steps or
    boxes, the same devices in the same roles) share one (read only). ``known``: the
    routes of other tasks on ``cluster`` (filled in as they are found), so that plans
    of the same tasks in other orders or steps find each route once. ``tensors``: the
    plan's, where the cluster charges messages (``Cluster.message_cost``): the tasks
    that ride in another's coalesced message add none, only a part of it
    (``Cluster.part_cost``)."""
    if known is None:
        known = Routes()
    per_message = bool((cluster.message_cost or cluster.part_cost)
                       and cluster.shared_bandwidth)
    riders = followers(tasks, tensors) if per_message and tensors else set()
    keys = route_keys(tasks, cluster.relay_piece, per_message, riders)
    got = list(map(known.get, keys))
    miss = [i for i, route in enumerate(got) if route is None]
    if not miss:
        return tuple(got)  # type: ignore[arg-type]  # every route found: none None
    # each key known lacks (in the order first met): its last task (one of its key's:
    # the same route)
    todo = dict(zip(map(keys.__getitem__, miss), miss))
    found = _find(tasks, todo, riders, cluster, known)
    if len(todo) < len(miss):  # a key lacked twice: each read back by its key
        return tuple([known[key] if route is None else route
                      for route, key in zip(got, keys)])
    # each key lacked once: the routes in the order of their tasks
    for i, route in zip(miss, found):
        got[i] = route
    return tuple(got)  # type: ignore[arg-type]  # every route found: none None


Found = list[Route | None]
"""Per key a call lacks (in the order first met), its route once found."""


def _find(tasks: Sequence[Task], todo: dict[tuple[object, ...], int],
          riders: set[int], cluster: Cluster, known: RouteMemo) -> list[Route]:
    """The route of each key of ``todo`` (with the place in ``tasks`` of a task of
    that key; ``riders``: the places of those that ride in another's message), in the
    order of ``todo``, each put in ``known``: the batches' first (:func:`_batch`,
    :func:`_shift_batch`, :func:`_relabel_batch`), then the rest one by one; a send
    on a cluster without shared bandwidth read from its hop (:func:`task_path`'s
    route of it)."""
    piece = cluster.relay_piece
    hops = shared_hops(known, cluster)
    if hops.step is None:
        hops.step = (hops.host_step(cluster),)
    step = hops.step[0]
    items = [(key, tasks[i]) for key, i in todo.items()]
    found: Found = [None] * len(todo)
    if step is None and not cluster.shared_bandwidth and not piece:
        # no piece, no message cost (no shared bandwidth): each key route_key(t, 0, 0, False)
        _batch(items, cluster, hops, found)
    if step is not None and len(tasks) >= SHIFT_BATCH:
        _shift_batch(items, step, cluster, hops, found)
    tried: Tried = {}  # large tasks' forms (relabeled_or_own)
    if step is not None and len(tasks) >= RELABEL_BATCH:
        _relabel_batch(items, step, cluster, hops, found, tried)
    if not cluster.shared_bandwidth:  # every send's route: its hop
        _send_batch(items, cluster, hops, found)
    for slot, (key, i) in enumerate(todo.items()):
        if found[slot] is not None:  # found by a batch
            continue
        t = items[slot][1]
        if step is not None and t.kind in _SHIFTED and t.root >= 0:
            found[slot] = shifted(t, key, step, _finder(t, cluster, hops), hops.forms()) \
                if len(t.receivers) < ARRAY_EDGES else \
                relabeled_or_own(t, key, step, _finder(t, cluster, hops),
                                 (hops.forms(), hops.chains(), hops.ones()), tried)
        else:
            path, lat = task_path(t, cluster, hops, rides=i in riders)
            found[slot] = (path if isinstance(path, Path) else Path(path), lat)
    known.update(zip(todo, found))  # type: ignore[arg-type]
    return found  # type: ignore[return-value]  # every route found: none None


RELABEL_BATCH = 16
"""Tasks of a plan from which the large routes :func:`~reshard.planner.costing.
relabel_many.relabeled_or_own` finds are found for all at once (:func:`_relabel_batch`;
fewer: task by task)."""


def _relabel_batch(items: list[tuple[tuple[object, ...], Task]], step: tuple[int, int],
                   cluster: Cluster, hops: Hops, found: Found, tried: Tried) -> None:
    """Put in ``found`` (by place in ``items``) the routes of ``items``' tasks (each
    with its route key) that :func:`task_routes` finds by :func:`~reshard.planner.
    costing.relabel_many.relabeled_or_own` and ``found`` lacks, found together
    (:func:`~reshard.planner.costing.relabel_many.relabeled_many`: the same routes,
    judged in the same order)."""
    todo = [slot for slot, (_, t) in enumerate(items)
            if t.kind in _SHIFTED and t.root >= 0 and len(t.receivers) >= ARRAY_EDGES
            and found[slot] is None]
    if len(todo) < RELABEL_BATCH:
        return
    got = relabeled_many([items[slot][1] for slot in todo], [items[slot][0] for slot in todo],
                         step, lambda t: _finder(t, cluster, hops), (hops.forms(), hops.ones()),
                         tried, hops.arrays(cluster)[1], hops.packed())
    if got is not None:  # else a device below 0: task by task
        for slot, route in zip(todo, got):
            found[slot] = route


SHIFT_BATCH = 256
"""Tasks of a plan from which the routes :func:`~reshard.planner.costing.route_forms.
shifted` finds are found for all at once (:func:`_shift_batch`; fewer: task by task,
without the arrays' fixed cost)."""


def _shift_batch(items: list[tuple[tuple[object, ...], Task]], step: tuple[int, int],
                 cluster: Cluster, hops: Hops, found: Found) -> None:
    """Put in ``found`` (by place in ``items``) the routes of ``items``' tasks (each
    with its route key) that :func:`task_routes` finds by :func:`~reshard.planner.
    costing.route_forms.shifted` and ``found`` lacks, found together
    (:func:`~reshard.planner.costing.route_forms.shifted_many`: the same routes)."""
    todo = [slot for slot, (_, t) in enumerate(items)
            if t.kind in _SHIFTED and t.root >= 0 and len(t.receivers) < ARRAY_EDGES
            and found[slot] is None]
    if len(todo) < SHIFT_BATCH:
        return
    got = shifted_many([items[slot][1] for slot in todo], [items[slot][0] for slot in todo],
                       step, lambda t: _finder(t, cluster, hops), hops.forms())
    for slot, route in zip(todo, got):
        found[slot] = route


def _finder(task: Task, cluster: Cluster, hops: Hops) -> Callable[[], Route]:
    """What searches ``task``'s own route (:func:`task_path`, as a :class:`Path`)."""
    def find() -> Route:
        path, lat = task_path(task, cluster, hops)
        return (path if isinstance(path, Path) else Path(path)), lat

    return find


def _batch(items: list[tuple[tuple[object, ...], Task]], cluster: Cluster, hops: Hops,
           found: Found) -> None:
    """Put in ``found`` (by place in ``items``) the routes of ``items``' broadcasts and
    reductions of a few edges, found together (:func:`~reshard.planner.costing.
    hop_batch.batch_routes`: the routes :func:`task_path` finds, on a cluster without
    relay pieces, shared bandwidth or host step; each task's key there is
    ``route_key(t, 0, 0, False)``)."""
    todo = [slot for slot, (_, t) in enumerate(items)
            if t.kind in _SHIFTED and t.root >= 0 and
            len(t.receivers) + len(t.addends) < ARRAY_EDGES]
    if len(todo) < BATCH_FROM:
        return
    tasks = [items[slot][1] for slot in todo]
    # edge_lists of each: a plain broadcast's (a chain or tree, no addends) inline
    broadcast = TaskKind.BROADCAST
    ends = [(t.parents or (t.root, *t.receivers[:-1]), t.receivers)
            if t.kind is broadcast and not t.addends else edge_lists(t) for t in tasks]
    got = batch_routes([s for s, _ in ends], [r for _, r in ends], *hops.arrays(cluster),
                       cluster.latency, cluster.intra_latency)
    if got is None:
        return
    ones = hops.ones()  # read-only fractions, shared by the paths of as many codes
    by_len = {n: read_only_ones(n, ones) for n in set(map(len, got[0]))}
    of_codes = Path.of_codes
    for slot, codes, reach in zip(todo, *got):
        if reach is None:  # a device reached twice: the loop's answer
            path, lat = task_path(items[slot][1], cluster, hops)
            found[slot] = (path if isinstance(path, Path) else Path(path), lat)
        else:
            found[slot] = (of_codes(codes, by_len[len(codes)]), reach)


BATCH_FROM = 24
"""Routes :func:`task_routes` finds together from (fewer: one by one, cheaper where
they are chains of a few dozen hops: the arrays take a round per hop)."""


def shared_hops(known: RouteMemo, cluster: Cluster) -> Hops:
    """The hops of ``known``, a memo of routes on ``cluster`` (made there when it has
    none); a fresh one, not kept, where the memo's are another cluster's or the memo
    is a plain dict (no :class:`Routes`)."""
    got = known.hops if isinstance(known, Routes) else None
    if got is not None and (got.cluster is cluster or got.cluster == cluster):
        return got
    hops = Hops()
    hops.cluster = cluster
    if got is None and isinstance(known, Routes):
        known.hops = hops
    return hops


_SHIFTED = frozenset((TaskKind.BROADCAST, TaskKind.REDUCE))
"""Kinds of task whose route is its edges' hops alone (every fraction 1): on a regular
cluster, the route of the same task whole hosts away is its own moved (a send's one
hop is found as cheaply, its hop kept per plan)."""


def one_at_a_time_time(plan: PlanView) -> float:
    """Seconds no plan of ``plan``'s tasks that runs each device's tasks one at a time
    can beat: per device, the sum over its tasks of each one's latency and its bytes
    over the slowest resource on its path (each task alone, at best), and of the
    conversions it makes for casts on the wire (each before its own task's bytes)."""
    cap = capacities(plan.cluster)
    kind_cap = np.array([cap[kind] for kind in KINDS])
    slowest: dict[int, float] = {}  # by id of a shared path
    seconds = []
    for t, (path, lat) in zip(plan.tasks, plan.routes()):
        per_byte = slowest.get(id(path))
        if per_byte is None and len(path) < ARRAY_EDGES:
            per_byte = slowest[id(path)] = max(
                (f / cap[r[0]] for r, f in path if f > 0), default=0.0)
        elif per_byte is None:
            codes, frac = path_arrays(path)
            on = frac > 0
            per_byte = slowest[id(path)] = float(
                (frac[on] / kind_cap[codes[on] % 8]).max(initial=0.0))
        seconds.append(lat + per_byte * t.nbytes)
    # each device's tasks' seconds added in task order (np.add.at: one by one)
    devs = [dict.fromkeys(t.devices) for t in plan.tasks]  # distinct, in order
    need = np.fromiter(map(len, devs), dtype=np.int64, count=len(devs))
    member = np.fromiter(itertools.chain.from_iterable(devs), dtype=np.int64,
                         count=int(need.sum()))
    conversions = conversion_seconds(plan)
    size = max(int(member.max(initial=-1)), max(conversions, default=-1)) + 1
    busy, touched = np.zeros(size), np.zeros(size, dtype=bool)
    for d, conv in conversions.items():
        busy[d], touched[d] = conv, True
    np.add.at(busy, member, np.repeat(np.array(seconds, dtype=np.float64), need))
    touched[member] = True
    return float(busy[touched].max()) if touched.any() else 0.0


__all__ = [
    "ARRAY_EDGES",
    "RELABEL_TRIAL",
    "SHIFT_HOSTS",
    "Estimate",
    "Hops",
    "Routes",
    "edge_pieces",
    "messages",
    "one_at_a_time_time",
    "route_key",
    "simulate",
    "stepped_floor",
    "task_path",
    "task_routes",
]

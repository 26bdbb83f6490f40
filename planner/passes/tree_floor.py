"""The ``trees`` passes' floor: seconds the cost model cannot put a tree form's plan
below, read from the starting plan's chains and their forms before ``treeify`` builds
the plan (no tree task made, routed or simulated).

Where every task of the starting plan is a chain the form reshapes (so every task of
the form's plan is one of its trees), each tree is the one :func:`~reshard.planner.
cells.trees.treeify` lays out: a chain's trees are those of its form, numbered back
(:func:`~reshard.planner.cells.trees.form_trees`), or, for a chain without a form or
with few receivers, laid out from the chain itself (:func:`~reshard.planner.cells.
trees.chain_trees`). The model prices a
tree's edges in order (:func:`~reshard.planner.costing.cost.task_path`): each edge
reaches its receiver its hop's wait (``latency`` where it crosses hosts, else
``intra_latency``) after its sender was reached by an earlier edge (0 if none), plus a
relay fill (never negative) where it was; the task waits the latest of those before
its bytes flow (plus conversion waits, never negative). The same sums in the same
order without the fills are no larger (float addition rounds monotonically): a floor
of each tree task's latency. Every edge that crosses hosts carries the task's bytes
over its sender's NIC out and its receiver's NIC in, at most ``nic_capacity`` each.

So the plan lasts at least (:func:`tree_floor`):

* every tree's latency floor (a task ends no earlier than its latency), and
* the least of those floors plus the bytes the busiest NIC carries over its capacity
  (no byte flows before its task's latency has passed: the simulation's own first
  bound, :func:`~reshard.planner.costing.fluid.simulate`).

A starting plan with any other task (a send, a reduction, a chain the form leaves as it
is) gets 0: its tasks' latencies and loads are not read, and the request's bound
decides. So do starting plans of many tasks on many hosts (:data:`FLOOR_WORK`).
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Mapping, Sequence

from reshard.cluster import Cluster
from reshard.planner.cells.chain_cuts import Chain, Cut, Form, Segments, cut_all
from reshard.planner.cells.trees import HostShape, Intra, chain_trees, form_trees, reshaped_by
from reshard.planner.values.tasks import Task, TaskKind

MARGIN = 1e-9
"""The floor is reported this much (relative) below its sum: the simulation's own float
sums may land an ulp under it."""

FLOOR_WORK = 4096
"""Starting plans whose tasks times the cluster's hosts exceed this get no floor (0):
the floor walks each chain's hosts, which at 1,024 devices (128 hosts, 1,023 chains)
costs far more than it saves, and there the forms it would be asked for were kept on
every request of the cold set (``star/star``) or had no candidate (``chain/star``)."""

TreeSum = tuple[float, tuple[int, ...], tuple[int, ...]]
"""A tree's latency floor, and the senders and receivers of its edges that cross hosts
(places of its chain, or devices)."""

FormSum = tuple[float, float, tuple[int, ...], tuple[int, ...]]
"""What a chain's trees give the floor: the least of their latency floors, the first
tree's (a double tree's first half is never empty), and the places whose NICs send and
take in the chain's whole box (a double tree's halves enter the same places, and its
NICs out are left out: they carry no more than those in; where its halves enter other
places, neither)."""

FormSums = dict[tuple[HostShape, Intra], dict[int, tuple[Form, FormSum]]]
"""Per tree form (shape, intra), each chain form's :data:`FormSum` by the form's id,
with the form (kept alive)."""


def _sums(trees: Sequence[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]],
          host: Sequence[int] | Mapping[int, int], cluster: Cluster) -> FormSum:
    """The :data:`FormSum` of a chain's trees (parents, receivers, ...; ``host``: of
    each of their numbers)."""
    sums: list[TreeSum] = []
    latency, intra = cluster.latency, cluster.intra_latency
    for parents, receivers, _ in trees:
        reach: dict[int, float] = {}
        senders, entered = [], []
        for a, b in zip(parents, receivers):
            cross = host[a] != host[b]
            at = reach.get(a, 0.0) + (latency if cross else intra)
            if at > reach.get(b, 0.0):
                reach[b] = at
            if cross:
                senders.append(a)
                entered.append(b)
        sums.append((max(reach.values(), default=0.0), tuple(senders), tuple(entered)))
    least = min(tree[0] for tree in sums)
    if len(sums) == 1:
        return least, sums[0][0], sums[0][1], sums[0][2]
    (first, _, one), (_, _, two) = sums
    return least, first, (), one if sorted(one) == sorted(two) else ()


def _chain_sum(task: Task, chain: Chain, ranges: Cut, shape: HostShape, intra: Intra,
               cluster: Cluster, sums: dict[int, tuple[Form, FormSum]]) -> FormSum:
    """``task``'s chain's :data:`FormSum`, numbered by its places where it has a form
    (found once per form, in ``sums``), else by its devices."""
    form = chain.form
    if form is None:
        trees = chain_trees(task, cluster.host_of, intra, shape, ranges)
        return _sums(trees, cluster.host_map, cluster)
    trees, placed = form_trees(form, intra, shape)
    got = sums[id(form)] = (form, _sums(trees, placed.tolist(), cluster))
    return got[1]


_KIND = operator.attrgetter("kind")
_PARENTS = operator.attrgetter("parents")

Chains = list[tuple[tuple[Task, Cut, Chain], int]]
"""A plan's chains a form reshapes: per chain, a task of it's memo entry (the task, its
cut and chain) and the bytes of its boxes over all its tasks."""


def tree_floor(tasks: Sequence[Task], cluster: Cluster, shape: HostShape, intra: Intra,
               memo: Segments, forms: FormSums | None = None) -> float:
    """Seconds no plan ``treeify(tasks, cluster.host_of, intra, shape, memo)`` is
    modelled below (see the module docstring); 0 where some task is not a chain
    ``shape`` reshapes, or too many on too many hosts (:data:`FLOOR_WORK`). ``memo``: the
    tasks' cuts and chains (filled in, as ``treeify`` would); ``forms``: the sums of
    forms found before (filled in)."""
    chains = reshaped_chains(tasks, cluster, shape, memo)
    return 0.0 if chains is None else floor_of(chains, cluster, shape, intra,
                                               {} if forms is None else forms)


def reshaped_chains(tasks: Sequence[Task], cluster: Cluster, shape: HostShape,
                    memo: Segments) -> Chains | None:
    """The chains of ``tasks`` (:data:`Chains`, each once), where every task is a chain
    ``shape`` reshapes and they are few enough (:data:`FLOOR_WORK`); else None. ``memo``:
    as :func:`tree_floor`'s (the same for every form of ``shape``)."""
    if len(tasks) * cluster.num_hosts > FLOOR_WORK:
        return None
    if set(map(_KIND, tasks)) != {TaskKind.BROADCAST} or any(map(_PARENTS, tasks)):
        return None  # a task no form reshapes
    applies = reshaped_by(shape)
    cut_all(tasks, cluster.host_of, memo, applies)
    found: dict[int, tuple[Task, Cut, Chain]] = {}  # by the chain's id: a task of it
    nbytes_of: dict[int, int] = {}  # and its boxes' bytes
    for t in tasks:
        got = memo[id(t)]
        if len(got) != 3:
            return None  # no chain: the form leaves it as it is
        whole = 1
        for lo, hi in t.box:  # box_size, inline (a call a task)
            whole *= hi - lo
        nbytes = whole * (t.nbytes // whole) if whole else 0  # its trees' bytes
        key = id(got[2])
        if key in nbytes_of:
            nbytes_of[key] += nbytes
        elif applies(got[1]):
            found[key], nbytes_of[key] = got, nbytes
        else:
            return None  # the form leaves it as it is
    return [(got, nbytes_of[key]) for key, got in found.items() if nbytes_of[key]]


def floor_of(chains: Chains, cluster: Cluster, shape: HostShape, intra: Intra,
             forms: FormSums) -> float:
    """:func:`tree_floor` of these chains (:func:`reshaped_chains`) for the form
    (``shape``, ``intra``)."""
    if not chains:
        return 0.0
    nic = cluster.nic_map
    sums = forms.setdefault((shape, intra), {})
    least, deepest = float("inf"), 0.0
    out: defaultdict[int, int] = defaultdict(int)  # bytes each NIC sends
    into: defaultdict[int, int] = defaultdict(int)  # bytes each NIC takes in
    for (task, ranges, chain), nbytes in chains:
        form = chain.form
        got = None if form is None else sums.get(id(form))
        if got is not None and got[0] is form:
            low, first, senders, entered = got[1]
        else:
            low, first, senders, entered = _chain_sum(task, chain, ranges, shape, intra,
                                                      cluster, sums)
        if low < least:  # noqa: PLR1730 (no call a chain)
            least = low
        if first > deepest:  # noqa: PLR1730
            deepest = first
        devices = chain.devices if form is not None else None
        for loads, ends in ((out, senders), (into, entered)):
            for e in ends:  # the NIC of each (a place of the chain, or a device)
                loads[nic[e if devices is None else devices[e]]] += nbytes
    busiest = max(max(out.values(), default=0), max(into.values(), default=0))
    return max(deepest, least + busiest / cluster.nic_capacity) * (1 - MARGIN)


__all__ = ["FLOOR_WORK", "MARGIN", "Chains", "FormSums", "floor_of", "reshaped_chains",
           "tree_floor"]

"""Broadcast trees: a chain that crosses many hosts, reshaped so its bytes reach the
farthest host after a few hops.

A pipelined chain pays one latency per hop: through 16 hosts of 8 GPUs that is 16
network and 113 NVLink latencies, 40% of a 250 MiB broadcast on DGX H100 machines. A
binary tree over the hosts pays log2 of the network hops, but its inner hosts send
every byte twice, so their NICs carry double. Two complementary trees fix that, as
NCCL's double binary tree does for all-reduce: the box is halved, each half goes down
its own binary tree over the same hosts, and every host is an inner node of at most
one of them, so each host's NIC sends at most the box once and receives it once, as
in the chain. Inside each host the entry device passes the pieces on to the host's
other receivers, all at once (``star``: one more latency, the entry sends k times) or
in a chain (``chain``: the entry sends once).

Pure: :func:`treeify` rewrites tasks; the planner keeps whichever plan the cost model
says is faster (:func:`reshard.planner.plan.plan_many`).
"""

from __future__ import annotations

import enum
import itertools
import operator
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from reshard.choice import parse_choice
from reshard.cluster import Cluster
from reshard.layout import box_size
from reshard.planner.cells.cell_tasks import split_box
from reshard.planner.values.tasks import Task, TaskKind

MIN_HOSTS = 3
"""A chain is reshaped only when it enters at least this many hosts after its root's
(over two hosts a tree is the chain)."""

class Intra(enum.Enum):
    """How a tree's entry device passes the pieces on inside its host."""

    STAR = "star"  # to each of the host's other receivers, all at once
    CHAIN = "chain"  # down a chain through them


class HostShape(enum.Enum):
    """How hosts are linked: two complementary binary trees over half boxes
    (``double``, chains entering at least :data:`MIN_HOSTS` hosts); the chain's own
    host order with each host's entry passing on straight to the next host's
    (``chain``, chains with at least :data:`MIN_FANOUT` receivers in some host); or
    every host's entry fed by the root's host directly (``star``, chains entering two
    or more hosts: fewer hops, more bytes through the root host's NICs)."""

    DOUBLE = "double"
    CHAIN = "chain"
    STAR = "star"


INTRA = tuple(Intra)
SHAPES = tuple(HostShape)

TREE_FORMS: tuple[tuple[HostShape, Intra], ...] = (
    (HostShape.DOUBLE, Intra.STAR), (HostShape.DOUBLE, Intra.CHAIN),
    (HostShape.CHAIN, Intra.STAR), (HostShape.STAR, Intra.STAR),
    (HostShape.STAR, Intra.CHAIN))
"""The (host shape, passing on inside a host) forms a broadcast plan is also costed in
(:mod:`reshard.planner.passes.stages`, one pass each)."""

MIN_FANOUT = 3
"""A host's receivers (its entry included) from which passing on inside it as a star
may pay (fewer: the star is the chain)."""


ChainForm = tuple[tuple[int, ...],
                  tuple[()] | tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]
"""A long chain's devices (root first) and what of it decides its trees
(:func:`_trees_by_form`: its segments' lengths, its hosts in the order entered, its
relay-only places; empty where a device comes twice)."""

Segments = dict[int, tuple[Task, list[list[int]]] | tuple[Task, list[list[int]], ChainForm]]
"""Tasks' host segments (:func:`_segments`) by the task's id, each with its task (kept
alive, so the id is not reused) and, once found, its chain's form
(:func:`_chain_form`): the tree forms of one plan cut each chain once."""


def _segments(task: Task, host: Callable[[int], int],
              memo: Segments | None = None) -> list[list[int]]:
    """The chain root -> receivers cut where it changes host (root's segment first);
    ``memo``: segments already cut (filled in; read only by the callers)."""
    if memo is not None:
        got = memo.get(id(task))
        if got is None:
            got = memo[id(task)] = (task, _segments(task, host))
        return got[1]
    if len(task.receivers) >= ARRAY_MEMBERS:
        chain = [task.root, *task.receivers]
        hosts = _hosts(chain, host)
        cuts = (np.flatnonzero(hosts[1:] != hosts[:-1]) + 1).tolist()
        return [chain[a:b] for a, b in zip([0, *cuts], [*cuts, len(chain)])]
    seg = [task.root]
    segs: list[list[int]] = [seg]
    here = host(task.root)
    for d in task.receivers:
        h = host(d)
        if h == here:
            seg.append(d)
        else:
            seg = [d]
            segs.append(seg)
            here = h
    return segs


def _hosts(devices: list[int], host: Callable[[int], int]) -> np.ndarray:
    """``host`` of each of ``devices``: read from the cluster's map of hosts at once
    where ``host`` is a cluster's :meth:`~reshard.cluster.Cluster.host_of` (the same
    values; a device it lacks: ``host``'s own error), else one call each."""
    owner = getattr(host, "__self__", None)
    if isinstance(owner, Cluster) and getattr(host, "__func__", None) is Cluster.host_of:
        try:
            return np.fromiter(map(owner.host_map.__getitem__, devices), dtype=np.int64,
                               count=len(devices))
        except KeyError:
            pass  # host_of names the device in its error
    return np.fromiter(map(host, devices), dtype=np.int64, count=len(devices))


def _heap_parent(i: int) -> int:
    return (i - 1) // 2


ARRAY_MEMBERS = 64
"""Members of a tree's hosts from which its edges are laid out as arrays (fewer: one
by one, the same edges without the arrays' fixed cost)."""


def _few_edges(order: Sequence[int], exit_dev: int, entry: dict[int, int],
               groups: list[list[int]], intra: Intra, parent: Callable[[int], int]
               ) -> tuple[list[int], list[int]]:
    """:func:`_tree_edges` of a few members (``groups``: each host's), one by one."""
    senders: list[int] = []
    receivers: list[int] = []
    star = intra is Intra.STAR
    for i, (h, group) in enumerate(zip(order, groups)):
        e = entry[h]
        up = parent(i)  # negative: the root's host
        senders.append(exit_dev if up < 0 else entry[order[up]])
        receivers.append(e)
        if not group:
            continue
        # a star: the entry sends to each member; a chain: each member's the one before
        if star:
            senders.extend([e] * len(group))
        else:
            senders.append(e)
            senders.extend(group[:-1])
        receivers.extend(group)
    return senders, receivers


def _tree_edges(order: Sequence[int], exit_dev: int, entry: dict[int, int],
                members: dict[int, list[int]], intra: Intra,
                parent: Callable[[int], int] = _heap_parent) -> tuple[list[int], list[int]]:
    """The senders and the receivers of one tree's edges over ``order`` (by default a
    binary tree in heap order: host ``order[i]``'s parent host is
    ``order[(i - 1) // 2]``; the first host's is ``exit_dev``'s), each host's entry
    then passing on to its members: host by host, its entry's edge then its members'."""
    groups = [members[h] for h in order]
    if sum(map(len, groups)) < ARRAY_MEMBERS:
        return _few_edges(order, exit_dev, entry, groups, intra, parent)
    entries = np.array([entry[h] for h in order], dtype=np.int64)
    up = np.array([parent(i) for i in range(len(order))], dtype=np.int64)
    fed_by = np.where(up < 0, exit_dev, entries[np.maximum(up, 0)])
    sizes = np.fromiter(map(len, groups), dtype=np.int64, count=len(groups)) + 1
    starts = np.cumsum(sizes) - sizes
    receivers = np.empty(int(sizes.sum()), dtype=np.int64)
    receivers[starts] = entries
    inner = np.ones(len(receivers), dtype=bool)
    inner[starts] = False
    receivers[inner] = np.fromiter(itertools.chain.from_iterable(groups), dtype=np.int64,
                                   count=int(inner.sum()))
    # a star: the entry sends to each member; a chain: each member's the one before it
    senders = np.repeat(entries, sizes) if intra is Intra.STAR else np.roll(receivers, 1)
    senders[starts] = fed_by
    return senders.tolist(), receivers.tolist()


FORM_MEMBERS = 2
"""Receivers of a chain from which :func:`treeify` finds its trees from its form
(:func:`_trees_by_form`, once per form; fewer: from the chain itself)."""


TreeForms = dict[tuple[object, ...],
                 list[tuple[Callable[[Sequence[int]], tuple[int, ...]], ...]]]
"""Trees of long chains by form (:func:`_trees_by_form`): per tree what takes its
parents, receivers and relay-only devices from the chain by their places, found once
per :func:`treeify` call."""

Edges = dict[tuple[int, tuple[int, ...], tuple[int, ...]],
             list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]]
"""Each chain's (root, receivers, relay-only devices) tree edges under one form (per
tree: its parents, receivers and relay-only devices kept), found once per
:func:`treeify` call: a box's pieces repeat their chain."""


def _reshape(task: Task, host: Callable[[int], int], intra: Intra,
             shape: HostShape, memo: Segments | None = None,
             edges: Edges | None = None, forms: TreeForms | None = None) -> list[Task]:
    """``task`` (a chain broadcast) as two half-box tasks down complementary binary
    trees over its remote hosts (``double``), or as one task down the chain's host
    order (``chain``), entries passing on inside their hosts as ``intra`` says
    (``edges``: the trees already found for a chain, filled in)."""
    key = (task.root, task.receivers, task.through)
    trees = None if edges is None else edges.get(key)
    if trees is None:
        trees = _trees_by_form(task, host, intra, shape, memo, forms) \
            if forms is not None and len(task.receivers) >= FORM_MEMBERS else \
            _trees_of(task, host, intra, shape, memo)
        if edges is not None:
            edges[key] = trees
    boxes = split_box(task.box, 2) if len(trees) == 2 else (task.box,)
    itemsize = task.nbytes // box_size(task.box) if box_size(task.box) else 0
    out: list[Task] = []
    for box, (parents, receivers, keep_through) in zip(boxes, trees):
        nbytes = box_size(box) * itemsize
        if nbytes == 0:
            continue
        out.append(Task(task.kind, task.tensor, box, task.root, receivers, nbytes,
                        task.step, task.source, task.pieces, keep_through, parents,
                        task.addends, task.addend_parents))  # replace(), built directly
    return out


def _trees_of(task: Task, host: Callable[[int], int], intra: Intra, shape: HostShape,
              memo: Segments | None
              ) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """:func:`_reshape`'s trees of ``task``'s chain: per tree (two halves for
    ``double``, else one), its parents, receivers and relay-only devices kept."""
    segs = _segments(task, host, memo)
    head, rest = segs[0], segs[1:]
    through = set(task.through)
    entry: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    hosts: list[int] = []
    for seg in rest:
        h = host(seg[0])
        hosts.append(h)
        entry[h] = seg[0]
        # a relay that only led out of the host is not needed: the entry sends on
        members[h] = [d for d in seg[1:] if d not in through] if through else seg[1:]
    if shape is HostShape.DOUBLE:
        half = len(hosts) // 2
        orders = [hosts, hosts[half:] + hosts[:half]]
    else:
        orders = [hosts]
    parent = _PARENT[shape]
    trees = []
    for order in orders:
        tree_senders, tree_receivers = _tree_edges(order, head[-1], entry, members, intra,
                                                   parent)
        parents = (*head[:-1], *tree_senders)
        receivers = (*head[1:], *tree_receivers)
        keep_through: tuple[int, ...] = ()
        if through:
            senders = set(parents)
            keep_through = tuple(d for d in receivers if d in through and d in senders)
        trees.append((parents, receivers, keep_through))
    return trees


def _trees_by_form(task: Task, host: Callable[[int], int], intra: Intra, shape: HostShape,
                   memo: Segments | None, forms: TreeForms
                   ) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """:func:`_trees_of` of a long chain of distinct devices, found once per form (in
    ``forms``): the chain renumbered by place (the root 0, receiver
    ``i`` ``i + 1``), its hosts in the order it enters them (its segments' lengths and
    hosts, its relay-only places), the trees of that chain numbered back.

    Exact: :func:`_trees_of` reads the devices only through which host each is in
    (equal or not, in :func:`_segments` and as its hosts' keys) and which are relays,
    and lays out its trees from their places in the chain and in its host order: the
    chain renumbered by a bijection that keeps hosts apart gives its trees renumbered."""
    chain, shaped = _chain_form(task, host, memo)
    if not shaped:  # a device twice: no bijection
        return _trees_of(task, host, intra, shape, memo)
    form = (intra, shape, *shaped)
    got = forms.get(form)
    if got is None:
        lengths, hosts, relays = shaped
        placed = np.repeat(np.array(hosts, dtype=np.int64), lengths)  # each place's host
        plain = Task(task.kind, task.tensor, task.box, 0, tuple(range(1, len(chain))),
                     task.nbytes, through=relays)
        got = forms[form] = [(_picker(p), _picker(r), _picker(k))
                             for p, r, k in _trees_of(plain, placed.item, intra, shape, None)]
    return [(p(chain), r(chain), k(chain)) for p, r, k in got]


def _chain_form(task: Task, host: Callable[[int], int], memo: Segments | None
                ) -> ChainForm:
    """``task``'s chain and its form (:data:`ChainForm`), found once per task where
    ``memo`` is given (kept beside its segments: every tree form of a plan reads it)."""
    got = None if memo is None else memo.get(id(task))
    if got is not None and len(got) == 3 and got[0] is task:
        return got[2]  # the form, found before
    chain = (task.root, *task.receivers)
    if len(set(chain)) < len(chain):  # a device twice: no bijection
        found: ChainForm = (chain, ())
    else:
        segs = _segments(task, host, memo)
        entered = _hosts([seg[0] for seg in segs], host).tolist() \
            if len(segs) >= ARRAY_MEMBERS else [host(seg[0]) for seg in segs]
        number = dict(zip(dict.fromkeys(entered), itertools.count()))  # in order entered
        through = frozenset(task.through)
        relays = tuple(i for i, d in enumerate(chain) if d in through) if through else ()
        found = (chain, (tuple(map(len, segs)), tuple(map(number.__getitem__, entered)),
                         relays))
    if memo is not None:
        memo[id(task)] = (task, _segments(task, host, memo), found)
    return found


def _picker(places: Sequence[int]) -> Callable[[Sequence[int]], tuple[int, ...]]:
    """What takes the items at ``places`` of a sequence, as a tuple."""
    if len(places) > 1:
        return operator.itemgetter(*places)
    if places:
        at = places[0]
        return lambda seq: (seq[at],)
    return lambda seq: ()


def _previous(i: int) -> int:
    return i - 1


def _first(i: int) -> int:
    """Every host hangs off the root's host."""
    return -1


_PARENT: dict[HostShape, Callable[[int], int]] = {
    HostShape.DOUBLE: _heap_parent, HostShape.CHAIN: _previous, HostShape.STAR: _first}
"""Each host shape's parent of the ``i``-th host it links (negative: the root's)."""

_APPLIES: dict[HostShape, Callable[[list[list[int]]], bool]] = {
    HostShape.DOUBLE: lambda segs: len(segs) - 1 >= MIN_HOSTS,
    HostShape.STAR: lambda segs: len(segs) - 1 >= 2,
    HostShape.CHAIN: lambda segs: any(len(seg) >= MIN_FANOUT for seg in segs[1:]),
}
"""Which chains (cut into host segments, the root's first) each host shape reshapes."""


def _applies(task: Task, host: Callable[[int], int], shape: HostShape,
             memo: Segments | None = None) -> bool:
    """Whether :func:`treeify` reshapes ``task`` for ``shape``."""
    if task.kind is not TaskKind.BROADCAST or task.parents:
        return False
    return _APPLIES[shape](_segments(task, host, memo))


def treeify(tasks: Iterable[Task], host: Callable[[int], int], intra: Intra | str,
            shape: HostShape | str = HostShape.DOUBLE,
            memo: Segments | None = None) -> tuple[Task, ...]:
    """``tasks`` with chain broadcasts reshaped in place (same step, same source):
    ``double``: each chain entering at least :data:`MIN_HOSTS` hosts after its root's
    becomes two half-box tasks down complementary binary trees over those hosts;
    ``chain``: each chain with at least :data:`MIN_FANOUT` receivers in some host
    keeps its host order, each host's entry passing straight on to the next host's;
    ``star``: each chain entering two or more hosts has every host's entry fed by
    the root's host.
    Inside a host the entry passes on as ``intra`` says (:class:`Intra`). ``memo``: the
    tasks' host segments already cut (:data:`Segments`, filled in).

    Raises:
        OptionError: ``intra`` or ``shape`` names no member (the error lists them).
    """
    how = parse_choice(Intra, intra, "passing on inside a host")
    form = parse_choice(HostShape, shape, "host shape")
    out: list[Task] = []
    edges: Edges = {}
    forms: TreeForms = {}
    applies, broadcast = _APPLIES[form], TaskKind.BROADCAST
    for t in tasks:  # _applies, inline (most tasks are sends)
        if t.kind is broadcast and not t.parents and applies(_segments(t, host, memo)):
            out.extend(_reshape(t, host, how, form, memo, edges, forms))
        else:
            out.append(t)
    return tuple(out)


def reshapes(tasks: Iterable[Task], host: Callable[[int], int],
             shape: HostShape | str, memo: Segments | None = None) -> bool:
    """Whether :func:`treeify` with ``shape`` would change any of ``tasks``
    (``memo``: as :func:`treeify`'s)."""
    form = parse_choice(HostShape, shape, "host shape")
    applies, broadcast = _APPLIES[form], TaskKind.BROADCAST
    return any(t.kind is broadcast and not t.parents and applies(_segments(t, host, memo))
               for t in tasks)  # _applies, inline

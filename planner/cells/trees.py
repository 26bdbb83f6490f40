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
from collections.abc import Callable, Iterable, Sequence, Sized

import numpy as np

from reshard.choice import parse_choice
from reshard.layout import box_size
from reshard.planner.cells.cell_tasks import split_box
from reshard.planner.cells.chain_cuts import Chain, Cut, Form, chain_of, cut, cut_all
from reshard.planner.cells.chain_cuts import Segments as Segments  # noqa: PLC0414 (re-exported)
from reshard.planner.cells.new_tasks import tree_task
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

Tree = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
"""A tree of a reshaped chain: its parents, receivers and relay-only devices kept."""

Picker = Callable[[Chain], tuple[int, ...]]
"""What takes some of a chain's devices by their places, as a tuple."""

TreeForms = dict[int, tuple[Form, list[tuple[Picker, Picker, Picker]]]]
"""Trees of chains by their form (:func:`_trees_by_form`), by the form's id (with the
form, kept alive): per tree what takes its parents, receivers and relay-only devices
from the chain, found once per form and :func:`treeify` call."""


def _trees_of(task: Task, host: Callable[[int], int], intra: Intra, shape: HostShape,
              ranges: Cut | None = None) -> list[Tree]:
    """:func:`_reshape`'s trees of ``task``'s chain (``ranges``: its cut, if found):
    per tree (two halves for ``double``, else one), its parents, receivers and
    relay-only devices kept."""
    devices = [task.root, *task.receivers]
    ranges = cut(task, host) if ranges is None else ranges
    head = devices[:ranges[0].stop]
    through = set(task.through)
    entry: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    hosts: list[int] = []
    for r in ranges[1:]:
        seg = devices[r.start:r.stop]
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


def _trees_by_form(chain: Chain, intra: Intra, shape: HostShape, forms: TreeForms
                   ) -> list[Tree]:
    """:func:`_trees_of` of a chain of distinct devices (``chain.form`` set), found once
    per form (in ``forms``): the chain renumbered by place (the root 0, receiver ``i``
    ``i + 1``), its hosts in the order it enters them (its segments' lengths and hosts,
    its relay-only places), the trees of that chain numbered back.

    Exact: :func:`_trees_of` reads the devices only through which host each is in
    (equal or not, in :func:`~reshard.planner.cells.chain_cuts.cut` and as its hosts'
    keys) and which are relays, and lays out its trees from their places in the chain
    and in its host order: the chain renumbered by a bijection that keeps hosts apart
    gives its trees renumbered."""
    form = chain.form
    assert form is not None  # the callers' rule
    got = forms.get(id(form))
    if got is None or got[0] is not form:
        size = len(chain.devices)
        got = forms[id(form)] = (form, [
            (_picker(p, size), _picker(r, size), _picker(k, size))
            for p, r, k in form_trees(form, intra, shape)[0]])
    return [(p(chain), r(chain), k(chain)) for p, r, k in got[1]]


def chain_trees(task: Task, host: Callable[[int], int], intra: Intra, shape: HostShape,
                ranges: Cut) -> list[Tree]:
    """The trees ``task``'s chain (cut into ``ranges``) is reshaped into, laid out from
    the chain itself (:func:`_trees_of`; the same trees as from its form)."""
    return _trees_of(task, host, intra, shape, ranges)


def form_trees(form: Form, intra: Intra, shape: HostShape) -> tuple[list[Tree], np.ndarray]:
    """The trees (:func:`_trees_of`) of a chain of this form numbered by place (the root
    0, receiver ``i`` ``i + 1``), and each place's host (numbered as entered): what
    :func:`_trees_by_form` numbers back for every chain of the form."""
    lengths, hosts, relays = form
    placed = np.repeat(np.array(hosts, dtype=np.int64), lengths)  # each place's host
    plain = Task(TaskKind.BROADCAST, 0, (), 0, tuple(range(1, len(placed))), 0,
                 through=relays)
    return _trees_of(plain, placed.item, intra, shape), placed


RUN_PLACES = 16
"""Places per run of consecutive places from which a picker takes slices of the chain
(fewer: one item each, as few slices cost more than they save)."""

MAX_RUNS = 4
"""Runs of consecutive places a picker takes as slices at most (more: one item each)."""

_receivers: Picker = operator.itemgetter(1)  # a Chain's own receivers


def _picker(places: Sequence[int], size: int) -> Picker:
    """What takes the devices at ``places`` of a chain of ``size`` devices, as a tuple:
    the chain's receivers tuple itself where ``places`` are all its receivers' in
    order, slices where they run on in a few long runs, else one item each."""
    if not places:
        return lambda chain: ()
    at = np.asarray(places, dtype=np.int64)
    breaks = (np.flatnonzero(at[1:] != at[:-1] + 1) + 1).tolist()
    bounds = list(zip([0, *breaks], [*breaks, len(places)]))
    runs = [slice(places[a], places[b - 1] + 1) for a, b in bounds]
    if runs == [slice(1, size)]:
        return _receivers
    if len(runs) == 1:
        (whole,) = runs
        return lambda chain: chain.devices[whole]
    if len(runs) <= MAX_RUNS and len(places) >= RUN_PLACES * len(runs):
        if len(runs) == 2:  # a double tree's second half: its hosts turned halfway
            first, second = runs
            return lambda chain: chain.devices[first] + chain.devices[second]
        return lambda chain: sum([chain.devices[run] for run in runs], ())
    getter = operator.itemgetter(*places)
    return lambda chain: getter(chain.devices)


class _Call:
    """What one :func:`treeify` call finds once: each chain's trees (a box's pieces
    repeat their chain) and each form's pickers."""

    def __init__(self, host: Callable[[int], int], intra: Intra, shape: HostShape):
        self.host, self.intra, self.shape = host, intra, shape
        self.trees: dict[int, tuple[Chain, list[Tree]]] = {}  # by the chain's id
        self.forms: TreeForms = {}

    def trees_of(self, task: Task, chain: Chain, ranges: Cut) -> list[Tree]:
        """``task``'s trees, found (``chain``, ``ranges``: its chain and cut)."""
        trees = _trees_by_form(chain, self.intra, self.shape, self.forms) \
            if chain.form is not None and len(task.receivers) >= FORM_MEMBERS else \
            _trees_of(task, self.host, self.intra, self.shape, ranges)
        self.trees[id(chain)] = (chain, trees)
        return trees

    def reshape(self, task: Task, chain: Chain, ranges: Cut) -> list[Task]:
        """``task`` (a chain broadcast) as two half-box tasks down complementary binary
        trees over its remote hosts (``double``), or as one task down its hosts
        (``chain``, ``star``), entries passing on inside their hosts as ``intra`` says
        (``chain``, ``ranges``: its chain and cut)."""
        got = self.trees.get(id(chain))
        trees = got[1] if got is not None and got[0] is chain else \
            self.trees_of(task, chain, ranges)
        box = task.box
        whole = box_size(box)
        itemsize = task.nbytes // whole if whole else 0
        if len(trees) != 2:  # one tree: the whole box
            ((parents, receivers, keep_through),) = trees
            nbytes = whole * itemsize
            return [tree_task(task, box, receivers, nbytes, keep_through, parents)] \
                if nbytes else []
        out: list[Task] = []
        for half, (parents, receivers, keep_through) in zip(split_box(box, 2), trees):
            nbytes = box_size(half) * itemsize
            if nbytes:
                out.append(tree_task(task, half, receivers, nbytes, keep_through, parents))
        return out


def _reshape(task: Task, host: Callable[[int], int], intra: Intra, shape: HostShape,
             memo: Segments | None = None) -> list[Task]:
    """``task`` reshaped alone (:meth:`_Call.reshape`)."""
    return _Call(host, intra, shape).reshape(task, chain_of(task, host, memo),
                                             cut(task, host, memo))


def _previous(i: int) -> int:
    return i - 1


def _first(i: int) -> int:
    """Every host hangs off the root's host."""
    return -1


_PARENT: dict[HostShape, Callable[[int], int]] = {
    HostShape.DOUBLE: _heap_parent, HostShape.CHAIN: _previous, HostShape.STAR: _first}
"""Each host shape's parent of the ``i``-th host it links (negative: the root's)."""

_APPLIES: dict[HostShape, Callable[[Sequence[Sized]], bool]] = {
    HostShape.DOUBLE: lambda segs: len(segs) - 1 >= MIN_HOSTS,
    HostShape.STAR: lambda segs: len(segs) - 1 >= 2,
    HostShape.CHAIN: lambda segs: any(len(seg) >= MIN_FANOUT for seg in segs[1:]),
}
"""Which chains (cut into host segments, the root's first) each host shape reshapes."""


def reshaped_by(shape: HostShape) -> Callable[[Sequence[Sized]], bool]:
    """Whether a chain cut into these host segments (the root's first) is reshaped for
    ``shape`` by :func:`treeify`."""
    return _APPLIES[shape]


def _applies(task: Task, host: Callable[[int], int], shape: HostShape,
             memo: Segments | None = None) -> bool:
    """Whether :func:`treeify` reshapes ``task`` for ``shape``."""
    if task.kind is not TaskKind.BROADCAST or task.parents:
        return False
    return _APPLIES[shape](cut(task, host, memo))


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
    tasks' cuts and chains already found (:data:`Segments`, filled in).

    Raises:
        OptionError: ``intra`` or ``shape`` names no member (the error lists them).
    """
    how = parse_choice(Intra, intra, "passing on inside a host")
    form = parse_choice(HostShape, shape, "host shape")
    tasks = tuple(tasks)
    memo = {} if memo is None else memo
    applies, broadcast = _APPLIES[form], TaskKind.BROADCAST
    cut_all(tasks, host, memo, applies)
    call = _Call(host, how, form)
    out: list[Task] = []
    for t in tasks:  # _applies, inline (most tasks are sends)
        if t.kind is broadcast and not t.parents:
            got = memo[id(t)]  # with its chain wherever it applies (cut_all)
            if len(got) == 3 and applies(got[1]):
                out.extend(call.reshape(t, got[2], got[1]))
                continue
        out.append(t)
    return tuple(out)


def reshapes(tasks: Iterable[Task], host: Callable[[int], int],
             shape: HostShape | str, memo: Segments | None = None) -> bool:
    """Whether :func:`treeify` with ``shape`` would change any of ``tasks``
    (``memo``: as :func:`treeify`'s)."""
    form = parse_choice(HostShape, shape, "host shape")
    applies, broadcast = _APPLIES[form], TaskKind.BROADCAST
    found = {} if memo is None else memo
    for t in tasks:  # _applies, inline (most tasks are sends); a cut found, read
        if t.kind is broadcast and not t.parents:
            got = found.get(id(t))
            if applies(cut(t, host, memo) if got is None else got[1]):
                return True
    return False

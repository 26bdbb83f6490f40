"""Broadcast chains cut where they change host, and their forms (for :mod:`.trees`).

A chain is its root, then its receivers: the device at place ``i`` is the root for 0,
receiver ``i - 1`` after. Its host segments are the places of each run of devices on
one host, as ranges (the root's first); the tree shapes read their lengths
(:data:`~reshard.planner.cells.trees.HostShape`). Its form (:class:`Chain`) is what of
it decides its trees: its segments' lengths, its hosts numbered in the order it enters
them, its relay-only places; a chain with a device twice has none (no renumbering maps
it to another chain).

The tree forms of one plan read each chain's cut and form once (:data:`Segments`, kept
per plan by the stage search). :func:`cut_all` finds those of a plan's chains at once:
each long chain's hosts read from one array of every long chain's devices (where the
host function is a cluster's own ``host_of``), chains met twice found once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.values.tasks import Task, TaskKind

ARRAY_DEVICES = 64
"""Receivers of a chain from which its hosts are read as arrays (fewer: one by one, the
same hosts without the arrays' fixed cost)."""

Form = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
"""A chain's segments' lengths, its hosts numbered in the order entered (a segment
each) and its relay-only places."""


class Chain(NamedTuple):
    """A chain's devices (root first), its task's own receivers (``devices[1:]``) and
    its form (None: a device comes twice)."""

    devices: tuple[int, ...]
    receivers: tuple[int, ...]
    form: Form | None


Cut = list[range]
"""A chain's host segments as ranges of places (the root's segment first)."""

Segments = dict[int, tuple[Task, Cut] | tuple[Task, Cut, Chain]]
"""Tasks' cuts (:func:`cut`) by the task's id, each with its task (kept alive, so the
id is not reused) and, once found, its chain (:func:`chain_of`)."""


def hosts_of(devices: Sequence[int], host: Callable[[int], int]) -> np.ndarray:
    """``host`` of each of ``devices``: read from the cluster's map of hosts at once
    where ``host`` is a cluster's :meth:`~reshard.cluster.Cluster.host_of` (the same
    values; a device it lacks: ``host``'s own error), else one call each."""
    owner = _cluster(host)
    if owner is not None:
        try:
            return np.fromiter(map(owner.host_map.__getitem__, devices), dtype=np.int64,
                               count=len(devices))
        except KeyError:
            pass  # host_of names the device in its error
    return np.fromiter(map(host, devices), dtype=np.int64, count=len(devices))


def _cluster(host: Callable[[int], int]) -> Cluster | None:
    """The cluster whose :meth:`~reshard.cluster.Cluster.host_of` ``host`` is, if any."""
    owner = getattr(host, "__self__", None)
    if isinstance(owner, Cluster) and getattr(host, "__func__", None) is Cluster.host_of:
        return owner
    return None


def _ranges(starts: list[int], size: int) -> Cut:
    return list(map(range, starts, [*starts[1:], size]))


def cut(task: Task, host: Callable[[int], int], memo: Segments | None = None) -> Cut:
    """``task``'s chain cut where it changes host (:data:`Cut`); ``memo``: cuts already
    found (filled in)."""
    if memo is not None:
        got = memo.get(id(task))
        if got is None:
            got = memo[id(task)] = (task, cut(task, host))
        return got[1]
    if len(task.receivers) >= ARRAY_DEVICES:
        hosts = hosts_of((task.root,) + task.receivers, host)  # noqa: RUF005 (one copy)
        starts = [0, *(np.flatnonzero(hosts[1:] != hosts[:-1]) + 1).tolist()]
        return _ranges(starts, len(hosts))
    return _ranges(_short(task, host)[0], len(task.receivers) + 1)


def _short(task: Task, host: Callable[[int], int]) -> tuple[list[int], list[int]]:
    """The first place of each of ``task``'s host segments and its host, one device at
    a time."""
    starts = [0]
    here = host(task.root)
    entered = [here]
    for i, d in enumerate(task.receivers, 1):
        h = host(d)
        if h != here:
            starts.append(i)
            entered.append(h)
            here = h
    return starts, entered


def segments(task: Task, host: Callable[[int], int],
             memo: Segments | None = None) -> list[list[int]]:
    """The devices of each of ``task``'s host segments (:func:`cut`)."""
    devices = [task.root, *task.receivers]
    return [devices[r.start:r.stop] for r in cut(task, host, memo)]


def _numbered(entered: list[int]) -> tuple[int, ...]:
    """Each segment's host numbered in the order the chain enters them."""
    number = dict(zip(dict.fromkeys(entered), itertools.count()))
    if len(number) == len(entered):  # each host entered once: 0, 1, 2...
        return tuple(range(len(entered)))
    return tuple(map(number.__getitem__, entered))


def _chain(task: Task, devices: tuple[int, ...], lengths: tuple[int, ...],
           entered: list[int] | None) -> Chain:
    """``task``'s chain; ``entered``: its segments' hosts (None: a device twice)."""
    if entered is None:
        return Chain(devices, task.receivers, None)
    through = frozenset(task.through)
    relays = tuple(i for i, d in enumerate(devices) if d in through) if through else ()
    return Chain(devices, task.receivers, (lengths, _numbered(entered), relays))


def _found(task: Task, host: Callable[[int], int], ranges: Cut) -> Chain:
    """:func:`chain_of` ``task``, its cut ``ranges`` found, one chain alone."""
    devices = (task.root,) + task.receivers  # noqa: RUF005 (one copy, not two)
    entered = None
    if len(set(devices)) == len(devices):
        firsts = [devices[r.start] for r in ranges]
        entered = hosts_of(firsts, host).tolist() if len(ranges) >= ARRAY_DEVICES \
            else list(map(host, firsts))
    return _chain(task, devices, tuple(map(len, ranges)), entered)


def chain_of(task: Task, host: Callable[[int], int], memo: Segments | None = None) -> Chain:
    """``task``'s chain and its form, found once per task where ``memo`` is given (kept
    beside its cut: every tree form of a plan reads it)."""
    got = None if memo is None else memo.get(id(task))
    if got is not None and len(got) == 3:
        return got[2]  # the 3-tuple's chain, found before
    ranges = cut(task, host, memo)
    found = _found(task, host, ranges)
    if memo is not None:
        memo[id(task)] = (task, ranges, found)
    return found


def cut_all(tasks: Iterable[Task], host: Callable[[int], int], memo: Segments,
            wanted: Callable[[Cut], bool]) -> None:
    """Fill ``memo`` with the cut of each of ``tasks`` a tree may reshape (broadcasts
    without parents) and the chain of each whose cut is ``wanted``: chains met twice
    found once (a long chain's receivers told by identity, as a box's pieces share
    their task's tuple: no long tuple hashed), the chains' hosts read from one array
    of all their devices where ``host`` is a cluster's own and there are long chains
    or at least :data:`BATCH_CHAINS` (each then with its chain, wanted or not: the
    same chain :func:`chain_of` finds), the same cuts and chains as :func:`cut` and
    :func:`chain_of`, which find the rest: a device the cluster lacks is named by
    ``host``'s own error."""
    found: dict[tuple[object, ...], tuple[Cut, Chain | None]] = {}
    cluster = _cluster(host)
    batch: dict[tuple[object, ...], Task] = {}  # to cut at once (on a cluster)
    todo: list[tuple[Task, tuple[object, ...]]] = []
    broadcast = TaskKind.BROADCAST
    long = False
    for t in tasks:
        if t.kind is not broadcast or t.parents:
            continue
        got = memo.get(id(t))
        if got is not None and (len(got) == 3 or not wanted(got[1])):
            continue  # found already, or cut and not wanted
        many = len(t.receivers) >= ARRAY_DEVICES
        key: tuple[object, ...] = (t.root, id(t.receivers) if many else t.receivers,
                                   t.through)
        todo.append((t, key))
        if key in found or key in batch:
            continue
        if cluster is not None:
            batch[key] = t
            long = long or many
        else:
            found[key] = _alone(t, host, wanted, None if got is None else got[1])
    if cluster is not None and (long or len(batch) >= BATCH_CHAINS):
        _cut_long(batch, cluster, host, found)
    else:
        for key, t in batch.items():
            got = memo.get(id(t))
            found[key] = _alone(t, host, wanted, None if got is None else got[1])
    _keep(todo, found, memo)


BATCH_CHAINS = 8
"""Chains (distinct) from which :func:`cut_all` cuts short chains on a cluster at once
(fewer, all short: one by one, without the arrays' fixed cost)."""


def _alone(t: Task, host: Callable[[int], int], wanted: Callable[[Cut], bool],
           ranges: Cut | None) -> tuple[Cut, Chain | None]:
    """``t``'s cut and, where ``wanted``, its chain, found alone (``ranges``: its cut,
    if found before)."""
    if ranges is not None:  # cut before, now wanted
        return ranges, _found(t, host, ranges)
    if len(t.receivers) >= ARRAY_DEVICES:
        ranges = cut(t, host)
        return ranges, _found(t, host, ranges) if wanted(ranges) else None
    starts, entered = _short(t, host)
    ranges = _ranges(starts, len(t.receivers) + 1)
    if not wanted(ranges):
        return ranges, None
    devices = (t.root,) + t.receivers  # noqa: RUF005 (one copy, not two)
    return ranges, _chain(t, devices, tuple(map(len, ranges)), entered
                          if len(set(devices)) == len(devices) else None)


def _cut_long(long: dict[tuple[object, ...], Task], cluster: Cluster,
              host: Callable[[int], int],
              found: dict[tuple[object, ...], tuple[Cut, Chain | None]]) -> None:
    """:func:`cut_all`'s chains on ``cluster`` (``host``: its ``host_of``), cut and
    their chains found at once (into ``found``, by key)."""
    table = _host_table(cluster)
    many = None if table is None else _cut_many(list(long.values()), table)
    for i, (key, t) in enumerate(long.items()):
        if many is None:  # a device the cluster lacks: host_of names it
            ranges = cut(t, host)
            found[key] = ranges, _found(t, host, ranges)
        else:
            found[key] = many[i]


def _keep(todo: list[tuple[Task, tuple[object, ...]]],
          found: dict[tuple[object, ...], tuple[Cut, Chain | None]], memo: Segments) -> None:
    """Each task of ``todo`` (with its :func:`_twin_key`) kept in ``memo`` with what was
    ``found`` for its key, equal forms made one object (trees key them by id)."""
    forms: dict[Form, Form] = {}
    for t, key in todo:
        ranges, chain = found[key]
        if chain is None:
            memo[id(t)] = (t, ranges)
            continue
        if chain.form is not None:
            form = forms.setdefault(chain.form, chain.form)
            if form is not chain.form:
                chain = chain._replace(form=form)
                found[key] = ranges, chain
        memo[id(t)] = (t, ranges, chain)


def _host_table(cluster: Cluster) -> np.ndarray | None:
    """Each device's host by its id (-1: no such device), or None where an id is
    negative."""
    hosts = cluster.host_map
    devices = np.fromiter(hosts, dtype=np.int64, count=len(hosts))
    if not len(devices) or devices.min() < 0:
        return None
    table = np.full(int(devices.max()) + 1, -1, dtype=np.int64)
    table[devices] = np.fromiter(hosts.values(), dtype=np.int64, count=len(devices))
    return table


DISTINCT_BINS = 4
"""Counts per device of the chains' devices at most this many times their number (and
a few more): the chains' devices told distinct by one bincount; more: one set each."""


def _distinct(chains: list[tuple[int, ...]], flat: np.ndarray, sizes: np.ndarray,
              span: int) -> list[bool]:
    """Whether each chain's devices (``flat``: all of them, ids below ``span``) are
    distinct."""
    n = len(chains)
    if n * span > DISTINCT_BINS * len(flat) + (1 << 16):
        return [len(set(c)) == len(c) for c in chains]
    rows = np.repeat(np.arange(n, dtype=np.int64) * span, sizes)
    counts = np.bincount(rows + flat, minlength=n * span).reshape(n, span)
    return (counts.max(axis=1) <= 1).tolist()  # type: ignore[no-any-return]


def _cut_many(tasks: list[Task], table: np.ndarray) -> list[tuple[Cut, Chain]] | None:
    """:func:`cut` and :func:`chain_of` of each of ``tasks`` (long chains), their hosts
    read from ``table`` (:func:`_host_table`) at once; None where it lacks a device."""
    receivers = [t.receivers for t in tasks]
    sizes = np.fromiter(map(len, receivers), dtype=np.int64, count=len(tasks)) + 1
    ends = np.cumsum(sizes)
    starts = ends - sizes
    each = [part for t in tasks for part in ((t.root,), t.receivers)]  # root, receivers
    flat = np.fromiter(itertools.chain.from_iterable(each), dtype=np.int64,
                       count=int(ends[-1]))
    if flat.min() < 0 or flat.max() >= len(table):
        return None
    hosts = table[flat]
    if hosts.min() < 0:
        return None
    new = np.empty(len(flat), dtype=bool)
    new[0] = True
    np.not_equal(hosts[1:], hosts[:-1], out=new[1:])
    new[starts] = True  # each chain's root starts its first segment
    first = np.flatnonzero(new)  # every segment's first place, over all chains
    last = np.append(first[1:], len(flat))
    bounds = [*np.searchsorted(first, starts).tolist(), len(first)]
    base = np.repeat(starts, np.diff(bounds))
    lo, hi = (first - base).tolist(), (last - base).tolist()
    lengths, entered = (last - first).tolist(), hosts[first].tolist()
    shared, at = _shared(flat, len(table)), [*starts.tolist(), len(flat)]
    devices = [tuple(shared[a:b]) for a, b in itertools.pairwise(at)]  # root, receivers
    distinct = _distinct(devices, flat, sizes, len(table))
    alike = _Alike(lo, hi, lengths, entered)
    out = []
    for i, t in enumerate(tasks):
        a, b = bounds[i], bounds[i + 1]
        ranges, form = alike.of(a, b, distinct[i])
        if form is None or not t.through:
            out.append((ranges, Chain(devices[i], t.receivers, form)))
        else:  # its relays' places: its own form
            out.append((ranges, _chain(t, devices[i], form[0], entered[a:b])))
    return out


class _Alike:
    """:func:`_cut_many`'s cuts and relay-free forms, found once per pattern of
    segments (their lengths, and their hosts numbered as entered) and shared by the
    chains of that pattern (a thousand cells broadcasting to one receiver set,
    relabeled, cut alike).

    Exact: a chain's cut is its segments' places, read from their lengths alone
    (segments tile the chain from place 0); its relay-free form is those lengths,
    its hosts numbered as entered (:func:`_numbered`, by their pattern of repeats
    alone), and no relays: equal patterns give equal cuts and forms (one object,
    as :func:`_keep` makes equal forms)."""

    def __init__(self, lo: list[int], hi: list[int], lengths: list[int],
                 entered: list[int]) -> None:
        self.lo, self.hi, self.lengths, self.entered = lo, hi, lengths, entered
        self.found: dict[tuple[tuple[int, ...], tuple[int, ...] | int | None],
                         tuple[Cut, Form | None]] = {}

    def of(self, a: int, b: int, distinct: bool) -> tuple[Cut, Form | None]:
        """The cut and relay-free form (None: a device twice) of the chain whose
        segments are ``a:b`` of all chains' (``distinct``: its devices are)."""
        lengths = tuple(self.lengths[a:b])
        hosts: tuple[int, ...] | int | None = None  # (a device twice: no form)
        if distinct:  # each host entered once: 0 (numbered 0, 1, 2...)
            entered = self.entered[a:b]
            hosts = 0 if len(set(entered)) == b - a else _numbered(entered)
        key = (lengths, hosts)
        got = self.found.get(key)
        if got is None:
            ranges = list(map(range, self.lo[a:b], self.hi[a:b]))
            got = self.found[key] = (ranges, None if hosts is None else
                                     (lengths, _numbered(self.entered[a:b]), ()))
        return got


def _shared(flat: np.ndarray, span: int) -> list[int]:
    """``flat``'s devices (ids below ``span``) with one int object per id: the chains'
    devices then share their ints (the same values), so the trees' parents picked from
    them (:mod:`.trees`, a thousand places from each of a thousand chains) touch a few
    thousand objects, not one per place (a box's tasks each had their own)."""
    present = np.zeros(span, dtype=bool)
    present[flat] = True
    ids = np.empty(span, dtype=object)  # an object for each id met (not each below span)
    ids[present] = np.flatnonzero(present).tolist()
    shared: list[int] = ids[flat].tolist()  # the objects themselves
    return shared

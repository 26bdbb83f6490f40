"""Broadcast chains' orders apart from the accumulator: a segment's idlest member
last (:func:`idlest_last`), and long chains ordered by sorts of arrays: :meth:`Loads.chain
<reshard.planner.cells.balance.Loads.chain>`'s order, and :meth:`Loads.relay_chain
<reshard.planner.cells.balance.Loads.relay_chain>`'s answer where no host boundary of
the chain may relay (the common case: a NIC per device whose hosts' NICs are all
expected to carry the same)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.cells.whole_sums import EXACT
from reshard.planner.values.resources import NIC_IN, NIC_OUT


class Loads(Protocol):
    """What these functions read of a :class:`~reshard.planner.cells.balance.Loads`
    (which imports them)."""

    @property
    def host(self) -> Callable[[int], int]: ...

    @property
    def nic(self) -> Callable[[int], int]: ...

    @property
    def nic_out(self) -> Mapping[int, float]: ...

    @property
    def nic_in(self) -> Mapping[int, float]: ...

    @property
    def cluster(self) -> Cluster: ...

    @property
    def _may_relay(self) -> dict[tuple[str, int], bool]: ...

    relay_mirror: RelayMirror | None
    receiver_memo: ReceiverMemo
    crossings: Crossings | None
    nic_mirror: NicMirror | None

    def may_relay_end(self, direction: str, member: int) -> bool: ...


class Receivers:
    """What :func:`_order` reads of a receiver list apart from the loads (it reads only
    the cluster): the devices, their hosts and NICs, the distinct hosts (sorted) and
    each device's among them, and the devices grouped by host (stably: by id inside a
    host), with each group's start and size."""

    __slots__ = ("at", "counts", "d", "distinct", "hosts", "nic_array", "nics", "own", "perm",
                 "single", "starts", "where")

    def __init__(self, loads: Loads, receivers: list[int]) -> None:
        n = len(receivers)
        self.d = np.array(receivers, dtype=np.int64)
        self.hosts = np.fromiter(map(loads.host, receivers), dtype=np.int64, count=n)
        self.nics = list(map(loads.nic, receivers))
        self.nic_array = np.array(self.nics, dtype=np.int64)
        self.distinct, at = np.unique(self.hosts, return_inverse=True)
        self.at = at.reshape(-1)
        self.perm = np.argsort(self.at, kind="stable")
        self.counts = np.bincount(self.at, minlength=len(self.distinct))
        self.starts = np.cumsum(self.counts) - self.counts
        self.own = len(set(self.nics)) == n  # a NIC each (NicMirror's condition)
        self.single = len(self.distinct) == n  # one receiver a host (_one_a_host)
        self.where: dict[int, tuple[int, ...]] | None = None  # NicMirror's

    def positions(self) -> dict[int, tuple[int, ...]]:
        """Each member's NIC's members' positions (found once)."""
        if self.where is None:
            where: dict[int, list[int]] = {}
            for i, n in enumerate(self.nics):
                where.setdefault(n, []).append(i)
            self.where = {n: tuple(at) for n, at in where.items()}
        return self.where


ReceiverMemo = dict[tuple[int, ...], Receivers]
""":class:`Receivers` by receiver list (a :class:`~reshard.planner.cells.balance.Loads`
keeps one, shared by its copies: it reads only the cluster)."""


def _receivers(loads: Loads, receivers: list[int]) -> Receivers:
    """``receivers``' :class:`Receivers`, found once per list."""
    memo = loads.receiver_memo
    key = tuple(receivers)
    got = memo.get(key)
    if got is None:
        got = memo[key] = Receivers(loads, receivers)
    return got


def _order(loads: Loads, root: int, receivers: list[int], idlest: bool = False
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """:func:`chain_arrays`' chain, with each member's host and NIC out load; with
    ``idlest``, :func:`unrelayed_chain`'s moves done in the same sort (each flagged
    member moved to its host's end, the flags in chain order; None: none moved).

    A host's least NIC out load and its entry (least NIC in load, then id) are read
    group by group (the devices grouped by host, by id inside one: the first of the
    least is the least id), the same as a minimum and a sort over all of them."""
    rec = _receivers(loads, receivers)
    d, hosts, nics, distinct, at = rec.d, rec.hosts, rec.nics, rec.distinct, rec.at
    n = len(d)
    mirror = loads.nic_mirror
    if mirror is not None and mirror.rec is rec:
        sent, got = mirror.sent, mirror.got  # read only here
    else:
        zero = itertools.repeat(0.0)  # an unseen NIC reads 0.0 (and is not added)
        sent = np.fromiter(map(loads.nic_out.get, nics, zero), dtype=np.float64, count=n)
        got = np.fromiter(map(loads.nic_in.get, nics, zero), dtype=np.float64, count=n)
        if mirror is not None:
            mirror.read(rec if rec.own else None, sent, got)
    rh = loads.host(root)
    local = hosts == rh
    if rec.single:
        order = _one_a_host(local, hosts, sent)
        if mirror is not None:
            mirror.order = order
        return d[order], hosts[order], sent[order], None
    perm, starts, counts = rec.perm, rec.starts, rec.counts
    least = np.minimum.reduceat(sent[perm], starts)
    remote = distinct != rh
    by_load = np.lexsort((distinct[remote], least[remote]))
    rank = np.full(len(distinct), -1, dtype=np.int64)  # the root's host first
    rank[np.flatnonzero(remote)[by_load]] = np.arange(len(by_load))
    last = len(by_load) - 1
    # each remote host's entry: its least NIC in load, then id (its first such)
    grouped = got[perm]
    lowest = np.flatnonzero(grouped == np.repeat(np.minimum.reduceat(grouped, starts), counts))
    entry = np.zeros(n, dtype=bool)
    entry[perm[lowest[np.searchsorted(lowest, starts)]]] = True
    entry &= ~local
    r = rank[at]
    by_out = (local & (last >= 0)) | (~local & ~entry & (r < last))
    key = np.where(by_out, -sent, 0.0)
    moved = _idlest(by_out, sent, rec, rec.at) if idlest else None
    if moved is None:
        order = np.lexsort((d, key, ~entry, r))
    else:
        order = np.lexsort((d, key, moved, ~entry, r))
        moved = moved[order]
    if mirror is not None:
        mirror.order = order
    return d[order], hosts[order], sent[order], moved


def _idlest(by_out: np.ndarray, sent: np.ndarray, rec: Receivers, at: np.ndarray
            ) -> np.ndarray | None:
    """The members :func:`unrelayed_chain` moves to their host's end (in the list's
    order; None: none): in each host with two or more members ordered by their NIC
    out loads (``by_out``: the members after the entry, in every host but the last
    one chained; the root's host's all), the one with the least (NIC out load, id),
    read host by host (``rec``'s groups: by id inside one, the first of the least is
    the least id); where a load is NaN (which a sort puts after every number) by a
    sort of those members by (host, NIC out load, id)."""
    perm, starts = rec.perm, rec.starts
    grouped = by_out[perm]
    many = np.add.reduceat(grouped.astype(np.int64), starts) >= 2
    if not many.any():
        return None
    moved = np.zeros(len(by_out), dtype=bool)
    if np.isnan(sent).any():
        pos = np.flatnonzero(by_out)  # (in id order)
        pos = pos[many[at[pos]]]
        pos = pos[np.lexsort((pos, sent[pos], at[pos]))]
        head = np.ones(len(pos), dtype=bool)
        head[1:] = at[pos[1:]] != at[pos[:-1]]
        moved[pos[head]] = True
        return moved
    out = np.where(grouped, sent[perm], np.inf)
    hit = np.flatnonzero(grouped & (out == np.repeat(np.minimum.reduceat(out, starts),
                                                       rec.counts)))
    moved[perm[hit[np.searchsorted(hit, starts[many])]]] = True
    return moved


def _one_a_host(local: np.ndarray, hosts: np.ndarray, sent: np.ndarray) -> np.ndarray:
    """:func:`_order`'s order of receivers one a host: the root's host's receiver (if
    any) first, then the others by NIC out load, then host. Each host's least NIC out
    load is its one receiver's, and each other host's one receiver is its entry, so no
    receiver is ordered by its own NIC out load inside a host: the general sort's keys
    leave only the hosts' ranks."""
    away = np.flatnonzero(~local)
    by_load = away[np.lexsort((hosts[away], sent[away]))]
    return np.concatenate((np.flatnonzero(local), by_load))


Crossings = tuple[tuple[int, ...], int, list[int]]
"""A chain :func:`unrelayed_chain` answered, its root's host and the positions in it
where it enters another host (each a host boundary it crosses), which a
:class:`Loads` keeps as ``crossings`` for its :meth:`Loads.charge`."""


class NicMirror:
    """The NIC loads :func:`_order` read of one receiver list whose members each have
    a NIC of their own (``sent``: NIC out, ``got``: NIC in, in the list's order),
    kept in step with :func:`charge_crossings`' additions (the same float additions,
    in the same order, to each NIC's copy), so that the next chain to the same
    receivers reads them without a lookup per member. It notes the last sort
    (``order``) and the chain :func:`unrelayed_chain` answered with its members'
    positions in the list (``chain``, ``at``), from which a charge of that chain
    finds the copies it adds to. A :class:`Loads` holds one (``nic_mirror``) only
    while whoever set it knows every other write to its NIC loads
    (:func:`~reshard.planner.cells.cell_tasks.plan_broadcasts` counts the charges,
    ``charges``: with any other write it is dropped)."""

    __slots__ = ("at", "chain", "charges", "got", "order", "pending", "rec", "sent", "taken")

    def __init__(self) -> None:
        self.rec: Receivers | None = None
        self.sent = self.got = self.order = self.at = np.zeros(0, dtype=np.int64)
        self.chain: tuple[int, ...] | None = None
        self.charges = 0
        self.taken: list[int] = []  # bytes of the chains to ``pending`` not yet in dev_in
        self.pending: Receivers | None = None

    def defer(self, dev_in: dict[int, float], chain: tuple[int, ...], nbytes: int) -> bool:
        """Whether :meth:`Loads.charge`'s additions of ``nbytes`` to ``chain``'s
        receive loads are left to :meth:`flush` (then noted): where ``chain`` is the
        one noted (its members are the mirrored list's, each already in ``dev_in``)
        and ``nbytes`` a whole number of bytes; else every one noted is added first
        (:meth:`flush`), for the caller's additions to follow them."""
        rec = self.rec
        if rec is None or chain is not self.chain or type(nbytes) is not int or nbytes < 0:
            self.flush(dev_in)
            return False
        if self.pending is not rec:
            self.flush(dev_in)
            if not all(map(dev_in.__contains__, chain)):
                return False
            self.pending = rec
        self.taken.append(nbytes)
        return True

    def flush(self, dev_in: dict[int, float]) -> None:
        """Add the noted charges' bytes to their receivers' loads: each member's
        additions in order, or, where every load is a whole number and stays below
        2**53 with all of them (every partial sum then exact, so every order of the
        same additions gives the same float), their sum once per member; one charge's
        (a run whose cells alternate between receiver lists) as the charge adds them:
        the arrays' checks would cost more than its additions."""
        rec, taken = self.pending, self.taken
        if rec is None or not taken:
            self.pending, self.taken = None, []
            return
        keys = rec.d.tolist()
        if len(taken) == 1:
            (nbytes,) = taken
            for d in keys:
                dev_in[d] += nbytes
            self.pending, self.taken = None, []
            return
        vals = np.fromiter(map(dev_in.__getitem__, keys), dtype=np.float64, count=len(keys))
        total = sum(taken)
        if total < EXACT and bool(np.all(vals >= 0)) and bool(np.all(vals == np.floor(vals))) \
                and float(vals.max()) + total < EXACT:
            dev_in.update(zip(keys, (vals + float(total)).tolist()))
        else:
            for nbytes in taken:
                for d in keys:
                    dev_in[d] += nbytes
        self.pending, self.taken = None, []

    def read(self, rec: Receivers | None, sent: np.ndarray, got: np.ndarray) -> None:
        """Mirror ``rec``'s loads just read from the tables (``None``: mirror none)."""
        self.rec, self.sent, self.got, self.chain = rec, sent, got, None

    def add(self, chain: tuple[int, ...], leaving: list[int], entering: list[int],
            root_nic: int | None, nbytes: int) -> None:
        """The additions :func:`charge_crossings` made for ``chain`` (at the positions
        in it a crossing leaves and enters; ``root_nic``: the first left the root's
        NIC), onto the copies in turn (``np.add.at``: one addition per occurrence, in
        order); where ``chain`` is not the one noted, the mirror drops its copies."""
        self.charges += 1
        rec = self.rec
        if rec is None:
            return
        if chain is not self.chain:
            self.rec = None
            return
        at = self.at
        out = at[leaving]
        if root_nic is not None:
            out = np.concatenate((rec.positions().get(root_nic, ()), out)).astype(np.int64)
        np.add.at(self.sent, out, nbytes)
        np.add.at(self.got, at[entering], nbytes)


    def charge(self, nic_out: dict[int, float], nic_in: dict[int, float], root_nic: int,
               chain: tuple[int, ...], at: list[int], nbytes: int) -> bool:
        """:func:`charge_crossings`' additions for the noted chain (it crosses a host
        boundary at each of ``at``, the first from the root, whose NIC is ``root_nic``,
        where ``at[0]`` is 0) made on the copies, then each NIC's sum written to the
        tables; False (nothing done) where ``chain`` is not the one noted.

        Exact: the copies are the tables' values (kept in step), so each sum is the
        table's value plus the same additions in the same order. The tables' keys come
        in the loop's order: the NICs out in crossing order (the root's first; the
        root's NIC, where not a receiver's, added to its table alone), the NICs in in
        crossing order, each table's own (a receiver's NIC is its alone: members each
        enter and leave once)."""
        rec = self.rec
        if rec is None or chain is not self.chain:
            return False
        self.charges += 1
        pos = self.at
        into = pos[at]
        out = pos[np.array(at, dtype=np.int64) - 1]  # each crossing's member left
        if not at[0]:  # the first crossing leaves the root
            out = out[1:]
            mine = rec.positions().get(root_nic)
            if mine is None:
                nic_out[root_nic] += nbytes
            else:
                out = np.concatenate((np.array(mine, dtype=np.int64), out))
        nics = rec.nic_array
        sent, got = self.sent, self.got
        np.add.at(sent, out, nbytes)
        got[into] += nbytes
        nic_out.update(zip(nics[out].tolist(), sent[out].tolist()))
        nic_in.update(zip(nics[into].tolist(), got[into].tolist()))
        return True


def charge_crossings(host: Callable[[int], int], nic: Callable[[int], int],
                     nic_out: dict[int, float], nic_in: dict[int, float], root: int,
                     chain: tuple[int, ...], nbytes: int, known: Crossings | None,
                     mirror: NicMirror | None = None) -> None:
    """The NIC charges of :meth:`Loads.charge` of a long chain: at each host boundary
    the chain crosses, in order, ``nbytes`` onto the NIC out of the device it leaves
    and the NIC in of the one it enters. The boundaries are ``known``'s where it is
    this very chain from a root on the same host (:func:`unrelayed_chain` found them
    in its arrays), else found by arrays (the hosts of every member at once); the
    NICs of each boundary looked up in bulk: the same additions in the same order
    (each boundary's NIC out, then its NIC in), and onto ``mirror``'s copies."""
    rh = host(root)
    if known is not None and known[0] is chain and known[1] == rh:
        at = known[2]
        if mirror is not None and at and mirror.charge(nic_out, nic_in, nic(root), chain, at,
                                                       nbytes):
            return
    else:
        hosts = np.fromiter(itertools.chain((rh,), map(host, chain)), dtype=np.int64,
                            count=len(chain) + 1)
        at = np.flatnonzero(hosts[1:] != hosts[:-1]).tolist()
    if not at:
        if mirror is not None:
            mirror.add(chain, [], [], None, nbytes)
        return
    # each crossing's NICs looked up in bulk (positions rise: only the first may be
    # 0, the root's)
    left = [i - 1 for i in at[1:]]
    outs = map(nic, itertools.chain((chain[at[0] - 1] if at[0] else root,),
                                    map(chain.__getitem__, left)))
    for o, n in zip(outs, list(map(nic, map(chain.__getitem__, at)))):
        nic_out[o] += nbytes
        nic_in[n] += nbytes
    if mirror is not None:
        mirror.add(chain, left if not at[0] else [at[0] - 1, *left], at,
                   None if at[0] else nic(root), nbytes)


def chain_arrays(loads: Loads, root: int, receivers: list[int]) -> tuple[int, ...]:
    """:meth:`Loads.chain` of many distinct ``receivers`` (sorted) by one sort of arrays:
    by host (the root's first, then by least NIC out load and host), then inside a
    host the entry (least NIC in load, then id) first and the rest by most NIC out
    load then id (in the last host and the root's host when no other follows: by
    id)."""
    return tuple(_order(loads, root, receivers)[0].tolist())


def unrelayed_chain(loads: Loads, root: int, receivers: list[int]) -> tuple[int, ...] | None:
    """:meth:`Loads.relay_chain` of many distinct ``receivers`` (sorted) on hosts with
    several NICs, when no host boundary of :func:`chain_arrays`' chain may relay;
    ``None`` when one may (then the walk one boundary at a time answers).

    The walk (``Loads._relay_walk``) asks :meth:`Loads._relay` to leave each host
    segment through its last member and to enter the next through its first; a
    member whose NIC may not relay (:meth:`Loads.may_relay_end`, false for every one
    of them here) gets ``None`` with nothing changed, and the walk then only moves,
    in each segment but the last of more than two devices (the root counted in its
    own), the member other than the first (the root or the entry) with the least
    (NIC out load, id) to the end; no device relays, so nothing is relay-only.
    :func:`_order` does that move for every segment in its one sort (by the same
    keys: the NIC out loads the chain was sorted by; no relay changes them).

    The walk's questions are of the chain before the moves: a segment's last then
    was the member with the least NIC out load and, of those, the greatest id; the
    one moved has the least id of them, so the last before it (the tie's greatest
    id, the members ordered by NIC out load, then id) where they tie, else itself.
    A NaN load sorts after every number both ways (as the most loaded and as the
    least by the negated key): the last before the move is then the member before
    it too (a NaN)."""
    d, h, sent, moved = _order(loads, root, receivers, idlest=True)
    mirror = loads.nic_mirror
    order = mirror.order if mirror is not None else None
    n = len(d)
    rh = loads.host(root)
    start = np.ones(n, dtype=bool)
    start[1:] = h[1:] != h[:-1]
    entries = np.flatnonzero(start & (h != rh))
    if not entries.size:  # every receiver on the root's host: one segment
        return _noted(loads, tuple(d.tolist()), rh, [], order)
    last = entries - 1 if entries[0] else entries[1:] - 1  # each segment's end, left
    if moved is not None:  # before the move: its tie's greatest id, or itself
        a, b = sent[last - 1], sent[last]
        tie = (a == b) | np.isnan(a)  # (a NaN sorts after every number, as a tie)
        last = np.where(moved[last] & tie, last - 1, last)
    leaving = d[last] if entries[0] else np.concatenate((np.array([root], dtype=np.int64),
                                                        d[last]))
    if may_relay_any(loads, NIC_OUT, leaving) or may_relay_any(loads, NIC_IN, d[entries]):
        return None
    return _noted(loads, tuple(d.tolist()), rh, entries.tolist(), order)


def _noted(loads: Loads, chain: tuple[int, ...], rh: int, entries: list[int],
           at: np.ndarray | None) -> tuple[int, ...]:
    """``chain``, its crossings noted in ``loads`` (:data:`Crossings`): the positions
    where it enters another host than the one before (the root's, host ``rh``, before
    the first). Its hosts are the sorted chain's (a member moves only inside its own
    host's segment), whose segments after the root's host each enter a new host at
    their first member, ``entries``."""
    loads.crossings = (chain, rh, entries)
    mirror = loads.nic_mirror
    if mirror is not None and at is not None:  # its members' places in the list
        mirror.chain, mirror.at = chain, at
    return chain


class RelayMirror:
    """:meth:`Loads.may_relay_end`'s cache as an array by device id per direction (1:
    may, 0: may not, -1: not asked yet), which a :class:`Loads` keeps as
    ``relay_mirror`` (:func:`may_relay_any` makes it). The cache only grows, each
    answer fixed once asked, in insertion order: :meth:`synced` copies in the entries
    added since it last looked."""

    __slots__ = ("arrays", "cache", "seen")

    def __init__(self, cache: dict[tuple[str, int], bool], span: int) -> None:
        self.cache = cache
        self.seen = 0  # the cache's entries copied in, in order
        self.arrays = {NIC_OUT: np.full(span, -1, dtype=np.int8),
                       NIC_IN: np.full(span, -1, dtype=np.int8)}

    def synced(self) -> RelayMirror:
        """This mirror with every entry of its cache copied in."""
        cache = self.cache
        if self.seen != len(cache):
            arrays = self.arrays
            for (way, member), got in itertools.islice(cache.items(), self.seen, None):
                arrays[way][member] = got
            self.seen = len(cache)
        return self


def _mirror(loads: Loads) -> RelayMirror:
    """``loads``' :class:`RelayMirror`, synced; a new one where it has none or where it
    mirrors another cache (a :meth:`Loads.copy` has its own)."""
    mirror = loads.relay_mirror
    if mirror is None or mirror.cache is not loads._may_relay:
        mirror = loads.relay_mirror = RelayMirror(loads._may_relay,
                                                  max(loads.cluster.devices) + 1)
    return mirror.synced()


def may_relay_any(loads: Loads, direction: str, members: np.ndarray) -> bool:
    """``any(loads.may_relay_end(direction, m) for m in members)``, the same answer
    with the same questions asked (the same cache left): the members in order but
    those already cached ``False`` (asking them changes nothing and says no), a
    member cached ``True`` ending it with no question, one not yet asked asked (its
    answer, the only entry a question adds, mirrored at once)."""
    state = _mirror(loads)
    mirror = state.arrays[direction]
    flags = mirror[members]
    open_ = flags.nonzero()[0]  # (one axis: flatnonzero's places)
    if not open_.size:
        return False
    may = loads.may_relay_end
    found = False
    for known, m in zip(flags[open_].tolist(), members[open_].tolist()):
        if known == 1:
            found = True
            break
        mirror[m] = got = may(direction, m)
        if got:
            found = True
            break
    state.seen = len(loads._may_relay)  # each answer added was mirrored as asked
    return found


def refused(loads: Loads, members: np.ndarray) -> bool:
    """Whether every one of ``members`` was asked :meth:`Loads.may_relay_end` in both
    directions and may not relay (each answer fixed once asked: :func:`may_relay_any`
    of them then says no and asks nothing, whatever the order)."""
    arrays = _mirror(loads).arrays
    return not arrays[NIC_OUT][members].any() and not arrays[NIC_IN][members].any()


def move_idlest_last(seg: list[int], nic_out: Mapping[int, float],
                      nic: Callable[[int], int]) -> None:
    """Move the member of ``seg`` after its first with the least (NIC out load, id)
    to its end (the member that leaves its host)."""
    _, last = min([(nic_out[nic(d)], d) for d in seg[1:]])
    seg.remove(last)
    seg.append(last)


def idlest_last(segments: list[list[int]], nic_out: Mapping[int, float],
                nic: Callable[[int], int]) -> tuple[int, ...]:
    """A chain's order (its root, first, left out) with :func:`move_idlest_last` done
    in every segment but the last of more than two devices, as
    :meth:`Loads._relay_walk` does where no member relays."""
    for seg in segments[:-1]:
        if len(seg) > 2:
            move_idlest_last(seg, nic_out, nic)
    return tuple([d for seg in segments for d in seg][1:])

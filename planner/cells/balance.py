"""Sender choice among replicas, balanced per NIC (the scarce resource)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.cells.chain_arrays import (
    Crossings,
    NicMirror,
    ReceiverMemo,
    RelayMirror,
    chain_arrays,
    charge_crossings,
    idlest_last,
    move_idlest_last,
    unrelayed_chain,
)
from reshard.planner.cells.chain_memo import ChainMemo
from reshard.planner.cells.holder_arrays import (
    ARRAY_HOLDERS,
    HolderMemo,
    holders_of,
    pick_root_arrays,
)
from reshard.planner.cells.short_chain import Split, entered, remote_chain, split_hosts
from reshard.planner.values.resources import NIC_IN, NIC_OUT

ARRAY_CHAIN = 64
"""Receivers from which :meth:`Loads.chain` orders them by one sort of arrays (fewer:
one by one; the same order)."""

def slice_demand(host: Callable[[int], int], nic: Callable[[int], int], shared_bandwidth: bool,
                 holders: frozenset[int], needers: frozenset[int], nbytes: int,
                 memo: NeederMemo | None = None
                 ) -> tuple[list[tuple[tuple[str, int], float]], float]:
    """A slice's NIC demand (:meth:`Loads.expect`), from nothing but its arguments:
    the amount each NIC is expected to carry (each NIC once), and the bytes the
    cluster's shared bandwidth (if it has one) carries. It leaves through its
    holders' NICs (shared evenly) and enters each host that needs it and holds none
    through its needers' NICs there (shared evenly). ``memo`` keeps what the
    needers' side reads (:class:`NeederMemo`)."""
    shared = float(nbytes * len(needers - holders)) if shared_bandwidth else 0.0
    if len(holders) == 1 and len(needers) == 1:  # point to point
        (a,), (b,) = holders, needers
        if host(a) == host(b):
            return [], shared
        return [((NIC_OUT, nic(a)), nbytes), ((NIC_IN, nic(b)), nbytes)], shared
    memo = memo if memo is not None else NeederMemo()
    out, into, entries = demand_parts(host, nic, holders, needers, nbytes, memo)
    if not into:
        return [], shared
    key = (holders, nbytes, into)
    leaving = memo.leaving.get(key)
    if leaving is None:  # the same amounts for every slice of these holders and bytes
        leaving = memo.leaving[key] = [((NIC_OUT, n), nbytes * into / len(out)) for n in out]
    return [*leaving, *entries], shared


def demand_parts(host: Callable[[int], int], nic: Callable[[int], int], holders: frozenset[int],
                 needers: frozenset[int], nbytes: int, memo: NeederMemo) -> Parts:
    """:func:`slice_demand`'s amounts of a slice not sent point to point, in parts:
    the holders' NICs (the set of them, in its order), each of which sends ``nbytes *
    into / len(out)`` where ``into`` (the number of hosts it enters) is not 0, and
    the amounts entering (:func:`_entering`)."""
    sides = memo.sides.get(needers)
    if sides is None:
        sides = memo.sides[needers] = _sides(host, nic, needers)
    held_by = holders_of(memo.holders, host, nic, holders)
    held = sides[2].intersection(held_by.hosts)
    key = (needers, nbytes, held)
    got = memo.entries.get(key)
    if got is None:
        got = memo.entries[key] = _entering(host, nic, needers, sides, held, nbytes)
    into, entries = got
    return held_by.out, into, entries


Entries = list[tuple[tuple[str, int], float]]
"""The ``NIC_IN`` amounts of a slice's demand (:func:`_entering`)."""

Parts = tuple[tuple[int, ...], int, Entries]
"""A slice's demand in parts (:func:`demand_parts`): the holders' NICs, the hosts it
enters, the amounts entering."""

Sides = tuple[np.ndarray | None, np.ndarray | None, frozenset[int]]
"""A needer set's devices' hosts and NICs (arrays, for many needers) and its hosts."""


class NeederMemo:
    """What :func:`slice_demand` found of slices' needers, for one cluster: per needer
    set, its :data:`Sides`; per needer set, bytes and needer hosts that also hold the
    slice, the amounts entering (which read nothing else: every cell of a broadcast
    to the same devices from holders on other hosts enters them alike). The amounts'
    order inside one answer is immaterial (each NIC once; :meth:`Loads.add_demand`
    adds each to its own total, which only lookups by NIC read)."""

    def __init__(self) -> None:
        self.sides: dict[frozenset[int], Sides] = {}
        self.entries: dict[tuple[frozenset[int], int, frozenset[int]],
                           tuple[int, Entries]] = {}
        # per receiver set: its host and (device, NIC) pairs in id order, or None
        self.one_host: dict[frozenset[int], tuple[int, tuple[tuple[int, int], ...]] | None] = {}
        self.holders: HolderMemo = {}  # per holder set (holder_arrays)
        # per receiver set (a few): short_chain.split_hosts' answer
        self.split: dict[frozenset[int], Split] = {}
        # per holder set, bytes and hosts entered: the NIC_OUT amounts (read only)
        self.leaving: dict[tuple[frozenset[int], int, int], Entries] = {}

    def grouped(self, loads: Loads, group: frozenset[int] | tuple[int, ...]
                ) -> tuple[list[int], Split | None]:
        """:func:`remote_chain`'s receivers (sorted) and split (:func:`split_hosts`)
        of ``group``: a set's split found once (an empty list then: the split says
        all), a tuple's sorted and left to it."""
        if not isinstance(group, frozenset):
            return sorted(group), None
        split = self.split.get(group)
        if split is None:
            split = self.split[group] = split_hosts(loads.host, loads.nic, sorted(group))
        return [], split


def _sides(host: Callable[[int], int], nic: Callable[[int], int], needers: frozenset[int]
           ) -> Sides:
    """``needers``' :data:`Sides` (arrays only from :data:`ARRAY_CHAIN` needers)."""
    if len(needers) < ARRAY_CHAIN:
        return None, None, frozenset(map(host, needers))
    devs = list(needers)
    hosts = np.fromiter(map(host, devs), dtype=np.int64, count=len(devs))
    nics = np.fromiter(map(nic, devs), dtype=np.int64, count=len(devs))
    return hosts, nics, frozenset(hosts.tolist())


def _entering(host: Callable[[int], int], nic: Callable[[int], int], needers: frozenset[int],
              sides: Sides, held: frozenset[int], nbytes: int) -> tuple[int, Entries]:
    """How many hosts a slice enters and its amounts entering them: needers on hosts
    outside ``held`` receive it through their NICs there, each host's share even
    over its distinct NICs; one by one, or for many needers by arrays, by (host,
    NIC) (each amount the same float)."""
    hosts, nics, _ = sides
    if hosts is None or nics is None:
        into: dict[int, set[int]] = {}
        for d in needers:
            h = host(d)
            if h not in held:
                into.setdefault(h, set()).add(nic(d))
        return len(into), [((NIC_IN, n), nbytes / len(got))
                           for got in into.values() for n in got]
    away = ~np.isin(hosts, list(held)) if held else np.ones(len(hosts), dtype=bool)
    pairs = np.unique(np.stack([hosts[away], nics[away]]), axis=1)  # (host, NIC)
    if not pairs.shape[1]:
        return 0, []
    entered, per_host = np.unique(pairs[0], return_counts=True)
    share = {h: nbytes / c for h, c in zip(entered.tolist(), per_host.tolist())}
    return len(entered), [((NIC_IN, n), share[h])
                          for h, n in zip(pairs[0].tolist(), pairs[1].tolist())]


def _distinct(given: Iterable[int], listed: list[int]) -> bool:
    """Whether ``listed`` (``given``'s members, as a list) holds each once: so where
    ``given`` is a set (its members are)."""
    return isinstance(given, (frozenset, set)) or len(set(listed)) == len(listed)


class Loads:
    """Bytes assigned so far to each NIC (per direction) and each device.

    A planning-call-local accumulator: :func:`reshard.planner.plan.plan_many` creates
    one, assigns the largest slices first, and each choice picks the holder that keeps
    the most loaded resource lowest. NICs are the cluster's (one per host, or one per
    device or device group on rail-optimised machines); a transfer leaves a host
    through its sending device's NIC and enters the next through its receiving
    device's.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.nic_out: defaultdict[int, float] = defaultdict(float)
        self.nic_in: defaultdict[int, float] = defaultdict(float)
        self.dev_out: defaultdict[int, float] = defaultdict(float)
        self.dev_in: defaultdict[int, float] = defaultdict(float)
        # plain lookups (the planner checked every device against the cluster)
        self.host = {d: h for h, devs in enumerate(cluster.hosts) for d in devs}.__getitem__
        self.nic = {d: cluster.nic_of(d) for d in cluster.devices}.__getitem__
        # bytes each NIC would carry with no relays (see expect / relay_chain)
        self.expected: dict[tuple[str, int], float] = defaultdict(float)
        self._least_expected: dict[tuple[str, int], float] = {}
        self._may_relay: dict[tuple[str, int], bool] = {}
        self.relay_mirror: RelayMirror | None = None  # chain_arrays.may_relay_any's
        self.receiver_memo: ReceiverMemo = {}  # chain_arrays' (copies share it)
        self.crossings: Crossings | None = None  # the last unrelayed_chain's
        self.nic_mirror: NicMirror | None = None  # cell_tasks.plan_broadcasts' (its run)
        # devices a transfer from a root must not relay through: the other addends of a
        # sum it reduces to be fused with its delivery (fuse_reductions leaves apart a
        # reduction whose delivery relays through one of its addends)
        self.keep_off: dict[int, frozenset[int]] = {}
        # bytes relays moved onto (+) or off (-) each NIC, per direction: its projected
        # final load is expected + moved
        self.moved: defaultdict[tuple[str, int], float] = defaultdict(float)
        # bytes the cluster's shared bandwidth (if any) is expected to carry: every
        # byte a device receives from another, relays' receipts included
        self.shared = 0.0
        # chains relay_chain worked out (see ChainMemo); _epoch counts the changes
        # to expected, moved and shared, which they read whole
        self._chains = ChainMemo()
        self._epoch = 0
        self._needers = NeederMemo()  # reads only the cluster: copies share it

    def copy(self) -> Loads:
        """Another accumulator with the same loads so far (each choice made on it
        leaves this one as it is)."""
        out = Loads.__new__(Loads)
        out.__dict__.update(self.__dict__)
        for name in ("nic_out", "nic_in", "dev_out", "dev_in", "expected", "moved"):
            setattr(out, name, getattr(self, name).copy())
        out._least_expected = dict(self._least_expected)
        out._may_relay = dict(self._may_relay)
        out.keep_off = dict(self.keep_off)
        out._chains = ChainMemo()  # each copy's choices move its own epochs
        out.nic_mirror = None  # mirrors this one's loads
        return out

    def expect(self, holders: frozenset[int], needers: frozenset[int], nbytes: int) -> None:
        """Account a slice's NIC demand before any choice: :meth:`demand`'s amounts
        added to :attr:`expected` (and, on a cluster with shared bandwidth, every
        byte a needer that holds none receives to :attr:`shared`)."""
        amounts, shared = self.demand(holders, needers, nbytes)
        self.add_demand(amounts, shared)

    def add_demand(self, amounts: Iterable[tuple[tuple[str, int], float]],
                   shared: float) -> None:
        """Add :meth:`demand`'s answer (one addition per NIC, in its order) to the
        expectations; the chains :meth:`relay_chain` remembered read them, so they
        are forgotten (:meth:`expected_changed`)."""
        expected = self.expected
        for key, amount in amounts:
            expected[key] += amount
        if self.cluster.shared_bandwidth:
            self.shared += shared
        self.expected_changed()

    def expected_changed(self, times: int = 1) -> None:
        """Note that :attr:`expected` changed (every writer calls this; ``times``: as
        often as so many writers): the chains :meth:`relay_chain` remembered may read
        it, so they are keyed by a new epoch."""
        self._epoch += times

    def demand(self, holders: frozenset[int], needers: frozenset[int], nbytes: int
               ) -> tuple[list[tuple[tuple[str, int], float]], float]:
        """:func:`slice_demand` on this accumulator's cluster (it reads nothing of the
        loads)."""
        return slice_demand(self.host, self.nic, bool(self.cluster.shared_bandwidth),
                            holders, needers, nbytes, self._needers)

    def demand_parts(self, holders: frozenset[int], needers: frozenset[int], nb: int) -> Parts:
        """:func:`demand_parts` on this accumulator's cluster."""
        return demand_parts(self.host, self.nic, holders, needers, nb, self._needers)

    def _crowded(self, direction: str, n: int, other: int) -> bool:
        """Whether NIC ``n`` is expected to carry more than NIC ``other`` of its host,
        by more than rounding (relaying from ``n`` through ``other`` evens them)."""
        a, b = self.expected[(direction, n)], self.expected[(direction, other)]
        return a > b * (1 + 1e-9) + 1

    def pick_root(self, holders: Collection[int], needer_hosts: set[int] | frozenset[int],
                  nbytes: int) -> int:
        """Choose the holder that sends a slice to devices on ``needer_hosts``.

        Key, lowest first: the holder's NIC out load after this slice (zero extra when
        every needer is on its own host), then whether its host needs the slice itself
        (such a root spares one NIC crossing), then the device's own send load, then id.
        """
        if len(holders) == 1:
            return next(iter(holders))
        if len(holders) >= ARRAY_HOLDERS and isinstance(holders, frozenset):
            held = holders_of(self._needers.holders, self.host, self.nic, holders)
            if (got := pick_root_arrays(self, held, needer_hosts, nbytes)) is not None:
                return got
        # every holder's key in the holders' order (the tables' unseen keys added in
        # it), the least by one min: every needer host remote where there are several
        if not holders:
            return -1
        host, nic, nic_out, dev_out = self.host, self.nic, self.nic_out, self.dev_out
        if len(needer_hosts) > 1:
            return min([(nic_out[nic(d)] + nbytes, host(d) not in needer_hosts, dev_out[d], d)
                        for d in holders])[3]
        return min([(nic_out[nic(d)] + (0 if (h := host(d)) in needer_hosts else nbytes),
                     h not in needer_hosts, dev_out[d], d) for d in holders])[3]

    def pick_sender(self, holders: Collection[int], receiver: int, nbytes: int) -> int:
        """Choose the holder that sends a slice point to point to ``receiver``: a holder
        on the receiver's host if there is one, else the least loaded NIC."""
        return self.pick_root(holders, {self.host(receiver)}, nbytes)

    def chain(self, root: int, receivers: Iterable[int]) -> tuple[int, ...]:
        """Order receivers as a broadcast chain: the root's host first, then the other
        hosts by ascending NIC out load (the last host forwards nothing). Inside a
        host, the device whose NIC has received least enters first and the one whose
        NIC has sent least leaves last (they differ only with several NICs per host)."""
        given, receivers = receivers, sorted(receivers)
        if len(receivers) >= ARRAY_CHAIN and _distinct(given, receivers):
            return chain_arrays(self, root, receivers)
        host, nic, nic_in, nic_out = self.host, self.nic, self.nic_in, self.nic_out
        rh = host(root)
        hosts_of = set(map(host, receivers))
        if len(hosts_of) == 1 and rh not in hosts_of:  # one other host: its entry first
            _, entry = min([(nic_in[nic(d)], d) for d in receivers])
            return (entry, *[d for d in receivers if d != entry])
        by_host: dict[int, list[int]] = {}
        for r in receivers:
            h = host(r)
            group = by_host.get(h)
            if group is None:
                by_host[h] = [r]
            else:
                group.append(r)
        # keys as tuples built in one pass (the same order as sorting by a key function)
        hosts = [h for _, h in sorted(
            (min([nic_out[nic(d)] for d in group]), h)
            for h, group in by_host.items() if h != rh)]
        order: list[int] = []
        local = by_host.get(rh, [])
        if local:
            if hosts:  # the last local receiver forwards to the next host
                local = [d for _, d in sorted([(-nic_out[nic(d)], d) for d in local])]
            order.extend(local)
        last = len(hosts) - 1
        for k, h in enumerate(hosts):
            group = by_host[h]
            order.extend(entered(group, nic_in, nic_out, nic, k < last)
                         if len(group) > 1 else group)
        return tuple(order)

    def send(self, root: int, receiver: int, nbytes: int) -> tuple[tuple[int, ...],
                                                                   tuple[int, ...]]:
        """:meth:`relay_chain` for one receiver, then :meth:`charge`: the chain and its
        relay-only devices. Cheap when neither end's NIC may relay (every transfer of
        an all-to-all)."""
        host, nic = self.host, self.nic
        h, hr = host(root), host(receiver)
        if h == hr:
            self.dev_out[root] += nbytes
            self.dev_in[receiver] += nbytes
            return (receiver,), ()
        if self.cluster.nics_per_host > 1 and self.may_relay(root, receiver):
            chain, through = self.relay_chain(root, (receiver,), nbytes)
            self.charge(root, chain, nbytes)
            return chain, through
        self.dev_out[root] += nbytes
        self.dev_in[receiver] += nbytes
        self.nic_out[nic(root)] += nbytes
        self.nic_in[nic(receiver)] += nbytes
        return (receiver,), ()

    def may_relay(self, root: int, receiver: int) -> bool:
        """Whether a point-to-point transfer between hosts may be relayed: either end
        may (:meth:`may_relay_end`); else :meth:`relay_chain` leaves it direct,
        whatever the loads."""
        return self.may_relay_end(NIC_OUT, root) or self.may_relay_end(NIC_IN, receiver)

    def may_relay_end(self, direction: str, member: int) -> bool:
        """Whether :meth:`_relay` may find another device of ``member``'s host to cross
        the host boundary through in ``direction`` (``NIC_OUT``: leaving; ``NIC_IN``:
        entering): some NIC of the host is expected to carry less than ``member``'s.
        Fixed once expectations are complete (:meth:`expect`); cached per device."""
        key = (direction, member)
        got = self._may_relay.get(key)
        if got is None:
            # (the member's NIC read first, then its host's least, found once a host)
            mine = self.expected[(direction, self.nic(member))]
            floor = self._least_expected.get(at := (direction, self.host(member)))
            if floor is None:
                nic, expected = self.nic, self.expected
                floor = self._least_expected[at] = min(
                    [expected[(direction, nic(d))] for d in self.cluster.hosts[at[1]]])
            got = self._may_relay[key] = mine > floor * (1 + 1e-9) + 1
        return got

    def relay_chain(self, root: int, receivers: Iterable[int], nbytes: int
                    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """:meth:`chain`, then, on hosts with several NICs, each host boundary crossed
        through the least loaded NIC of the host it leaves and of the host it enters,
        through a device that needs nothing if its NIC is less loaded than every
        chain member's there and the plan's slices as a whole are expected to crowd
        the members' NIC more than it (:meth:`expect`): a relay-only receiver, as
        NCCL's PXN routes through a peer GPU. Relaying costs an intra-host hop, so
        NICs that even out by themselves (an all-to-all) get none. Returns the chain
        and its relay-only devices. An answer that relays nothing is remembered
        (:class:`ChainMemo`: a later call whose answer would read the same reads it),
        but a short chain to other hosts without relays (:func:`remote_chain`)."""
        group = receivers if isinstance(receivers, (frozenset, tuple)) else tuple(receivers)
        if len(group) == 1:  # point to point: the common case, kept cheap
            r = next(iter(group))
            if self.cluster.nics_per_host == 1 or self.host(r) == self.host(root):
                return (r,), ()
            used = {root, r, *self.keep_off.get(root, ())}
            cached = self._may_relay.get  # a cached False: _relay's None (nothing changed)
            out = None if cached((NIC_OUT, root)) is False else \
                self._relay(NIC_OUT, root, self.host(root), used, nbytes)
            into = None if cached((NIC_IN, r)) is False else \
                self._relay(NIC_IN, r, self.host(r), used, nbytes)
            relays = tuple(d for d in (out, into) if d is not None)
            return (*relays, r), relays
        if len(group) < ARRAY_CHAIN and self.cluster.nics_per_host > 1 and (
                short := remote_chain(self, root, *self._needers.grouped(self, group))
        ) is not None and short[1]:
            return short[1], ()  # no relay: cheaper than the memo (whose answer it is)
        return self._chains.answer(self, root, group, nbytes)

    def _relay_through(self, root: int, receivers: Iterable[int], nbytes: int
                       ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """:meth:`relay_chain` of several receivers, worked out: by arrays for many
        (:func:`unrelayed_chain`, where no host boundary may relay), else
        :meth:`_relay_walk` of :meth:`chain`."""
        if self.cluster.nics_per_host == 1:
            return self.chain(root, receivers), ()
        group = sorted(receivers)
        if len(group) >= ARRAY_CHAIN and _distinct(receivers, group):
            got = unrelayed_chain(self, root, group)
            if got is not None:
                return got, ()
        elif (short := remote_chain(self, root, group)) is not None:  # few hosts
            return (short[1], ()) if short[1] is not None else \
                self._relay_walk(root, short[0], nbytes)
        return self._relay_walk(root, self.chain(root, group), nbytes)

    def _relay_walk(self, root: int, chain: tuple[int, ...], nbytes: int,
                    quick: bool = True) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """:meth:`relay_chain` of ``chain`` (:meth:`chain`'s, hosts with several NICs),
        one host boundary at a time; ``quick``: where no boundary's member may relay
        (:meth:`may_relay_end`), by :func:`idlest_last` alone.

        Proof of ``quick``: :meth:`_relay` of a member that may not relay returns
        ``None`` and changes nothing; the members asked are each segment's last as
        chained (only its successor's relay is inserted, at its front) and each
        segment's first; with no relay nothing is relay-only and the walk does only
        :func:`idlest_last`'s moves."""
        if not chain:
            return chain, ()
        host, nic = self.host, self.nic
        may = self.may_relay_end
        here = host(chain[0])
        # one host (a host's receivers are chained together): one segment, or two
        # whose first is the root alone
        if here == host(chain[-1]) and (here == host(root) or (
                quick and not may(NIC_OUT, root) and not may(NIC_IN, chain[0]))):
            return chain, ()
        seg = [root]
        segments: list[list[int]] = [seg]
        here = host(root)
        for d in chain:
            h = host(d)
            if h == here:
                seg.append(d)
            else:
                seg = [d]
                segments.append(seg)
                here = h
        if len(segments) == 1:
            return chain, ()
        if quick and not any(may(NIC_OUT, a[-1]) for a in segments[:-1]) and \
                not any(may(NIC_IN, b[0]) for b in segments[1:]):
            return idlest_last(segments, self.nic_out, nic), ()
        members = set(chain)
        used = members | {root, *self.keep_off.get(root, ())}
        through: list[int] = []
        for a, b in itertools.pairwise(segments):
            relay = self._relay(NIC_OUT, a[-1], host(a[-1]), used, nbytes)
            if relay is not None:
                a.append(relay)
            elif len(a) > 2:  # the root stays first; the idlest member leaves last
                move_idlest_last(a, self.nic_out, nic)
            relay = self._relay(NIC_IN, b[0], host(b[0]), used, nbytes)
            if relay is not None:
                b.insert(0, relay)
            for r in (a[-1], b[0]):
                if r != root and r not in members and r not in through:
                    through.append(r)
        order = tuple(d for seg in segments for d in seg)[1:]
        return order, tuple(through)

    def _relay(self, direction: str, member: int, h: int, used: set[int],
               nbytes: int) -> int | None:
        """A device of host ``h`` outside the chain to cross the host boundary through
        instead of ``member``: the one whose NIC's projected load (expected, plus what
        relays moved onto it, less what they moved off) is least, if the plan's slices
        crowd ``member``'s NIC more than it and moving these ``nbytes`` leaves it no
        more loaded than ``member``'s NIC was (a relay must even the NICs out, not swap
        which one is crowded: with shards a row apart, the NIC of the smaller shards
        took every relay, 1.6x the bound)."""
        nic = self.nic
        if not self.may_relay_end(direction, member):
            return None  # no NIC of the host is expected to carry less
        load = self.nic_out if direction == NIC_OUT else self.nic_in
        free = [d for d in self.cluster.hosts[h] if d not in used]
        if not free:
            return None
        expected, moved = self.expected, self.moved

        def projected(d: int) -> float:
            key = (direction, nic(d))
            return expected[key] + moved[key]

        # min(free, key=lambda d: (projected(d), load[nic(d)], d)), the same keys compared
        best = min([(expected[key] + moved[key], load[key[1]], d) for d in free
                    for key in ((direction, nic(d)),)])[2]
        if nic(best) == nic(member) or load[nic(best)] >= load[nic(member)] or \
                projected(best) + nbytes > projected(member) or \
                not self._crowded(direction, nic(member), nic(best)) or \
                self._shared_binds(projected(member), nbytes):
            return None
        moved[(direction, nic(best))] += nbytes
        moved[(direction, nic(member))] -= nbytes
        self._epoch += 1  # projected loads changed: remembered chains read them
        self.shared += nbytes  # the relay receives the bytes too
        used.add(best)
        return best

    def _shared_binds(self, nic_bytes: float, nbytes: int) -> bool:
        """Whether the cluster's shared bandwidth, with a relay's ``nbytes`` more on
        it, would take longer than a NIC carrying ``nic_bytes``: then relaying off
        that NIC saves nothing and costs the relay's receipt (on one machine's
        loopback links every relayed byte is one more for the same cores to move)."""
        shared = self.cluster.shared_bandwidth
        return bool(shared) and \
            (self.shared + nbytes) / shared >= nic_bytes / self.cluster.nic_capacity

    def charge(self, root: int, chain: tuple[int, ...], nbytes: int) -> None:
        """Account a pipelined chain transfer root -> chain[0] -> chain[1] ....

        Each host boundary the chain crosses (:func:`~reshard.planner.values.resources.
        crossings`, walked inline: this runs once per task) charges the NIC it leaves
        through and the one it enters through; a one-hop chain (a send) without the
        walk, the same additions in the same order."""
        if not chain:
            return
        self.dev_out[root] += nbytes
        if len(chain) == 1:
            (r,) = chain
            self.dev_in[r] += nbytes
            host = self.host
            if host(r) != host(root):
                nic = self.nic
                self.nic_out[nic(root)] += nbytes
                self.nic_in[nic(r)] += nbytes
            return
        dev_in = self.dev_in
        mirror = self.nic_mirror
        if mirror is None or not mirror.defer(dev_in, chain, nbytes):
            for r in chain:
                dev_in[r] += nbytes
        if len(chain) >= ARRAY_CHAIN:
            charge_crossings(self.host, self.nic, self.nic_out, self.nic_in, root, chain, nbytes,
                             self.crossings, self.nic_mirror)
            return
        host, nic, nic_out, nic_in = self.host, self.nic, self.nic_out, self.nic_in
        prev, prev_host = root, host(root)
        for d in chain:
            h = host(d)
            if h != prev_host:
                nic_out[nic(prev)] += nbytes
                nic_in[nic(d)] += nbytes
                prev_host = h
            prev = d


def may_relay_ends(loads: Loads, direction: str, members: Iterable[int]) -> list[bool]:
    """:meth:`Loads.may_relay_end` of each of ``members`` in turn (the same answers,
    asked and cached in the same order), its cached answers read without a call."""
    get, ask = loads._may_relay.get, loads.may_relay_end
    return [ask(direction, m) if (got := get((direction, m))) is None else got
            for m in members]

"""Sender choice among replicas, balanced per NIC (the scarce resource)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Collection, Iterable

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.values.resources import NIC_IN, NIC_OUT

ARRAY_CHAIN = 64
"""Receivers from which :meth:`Loads.chain` orders them by one sort of arrays (fewer:
one by one; the same order)."""


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
        return out

    def expect(self, holders: frozenset[int], needers: frozenset[int], nbytes: int) -> None:
        """Account a slice's NIC demand before any choice: it leaves through its
        holders' NICs (shared evenly) and enters each host that needs it and holds
        none through its needers' NICs there (shared evenly)."""
        nic, host = self.nic, self.host
        if self.cluster.shared_bandwidth:
            self.shared += nbytes * len(needers - holders)
        if len(holders) == 1 and len(needers) == 1:  # point to point
            (a,), (b,) = holders, needers
            if host(a) != host(b):
                self.expected[(NIC_OUT, nic(a))] += nbytes
                self.expected[(NIC_IN, nic(b))] += nbytes
            return
        if len(needers) >= ARRAY_CHAIN:
            self._expect_many(holders, needers, nbytes)
            return
        hold_hosts = {host(d) for d in holders}
        into: dict[int, set[int]] = {}
        for d in needers:
            h = host(d)
            if h not in hold_hosts:
                into.setdefault(h, set()).add(nic(d))
        if not into:
            return
        out = {nic(d) for d in holders}
        for n in out:
            self.expected[(NIC_OUT, n)] += nbytes * len(into) / len(out)
        for nics in into.values():
            for n in nics:
                self.expected[(NIC_IN, n)] += nbytes / len(nics)

    def _expect_many(self, holders: frozenset[int], needers: frozenset[int],
                     nbytes: int) -> None:
        """:meth:`expect` of a slice of many needers, its NICs found as arrays (each
        NIC's expectation gets one addition, the same float as the loop's)."""
        nic, host = self.nic, self.host
        hold_hosts = {host(d) for d in holders}
        devs = list(needers)
        hosts = np.fromiter(map(host, devs), dtype=np.int64, count=len(devs))
        nics = np.fromiter(map(nic, devs), dtype=np.int64, count=len(devs))
        away = ~np.isin(hosts, list(hold_hosts))
        pairs = np.unique(np.stack([hosts[away], nics[away]]), axis=1)  # (host, NIC)
        if not pairs.shape[1]:
            return
        into, per_host = np.unique(pairs[0], return_counts=True)
        out = {nic(d) for d in holders}
        expected = self.expected
        for n in out:
            expected[(NIC_OUT, n)] += nbytes * len(into) / len(out)
        share = {h: nbytes / c for h, c in zip(into.tolist(), per_host.tolist())}
        for h, n in zip(pairs[0].tolist(), pairs[1].tolist()):
            expected[(NIC_IN, n)] += share[h]

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
        best_key = None
        best = -1
        host, nic, nic_out, dev_out = self.host, self.nic, self.nic_out, self.dev_out
        for d in holders:
            h = host(d)
            remote = len(needer_hosts) > 1 or h not in needer_hosts
            key = (nic_out[nic(d)] + (nbytes if remote else 0), h not in needer_hosts,
                   dev_out[d], d)
            if best_key is None or key < best_key:
                best_key, best = key, d
        return best

    def pick_sender(self, holders: Collection[int], receiver: int, nbytes: int) -> int:
        """Choose the holder that sends a slice point to point to ``receiver``: a holder
        on the receiver's host if there is one, else the least loaded NIC."""
        return self.pick_root(holders, {self.host(receiver)}, nbytes)

    def chain(self, root: int, receivers: Iterable[int]) -> tuple[int, ...]:
        """Order receivers as a broadcast chain: the root's host first, then the other
        hosts by ascending NIC out load (the last host forwards nothing). Inside a
        host, the device whose NIC has received least enters first and the one whose
        NIC has sent least leaves last (they differ only with several NICs per host)."""
        receivers = sorted(receivers)
        if len(receivers) >= ARRAY_CHAIN and len(set(receivers)) == len(receivers):
            return self._chain_arrays(root, receivers)
        host = self.host
        rh = host(root)
        by_host: dict[int, list[int]] = {}
        for r in receivers:
            h = host(r)
            group = by_host.get(h)
            if group is None:
                by_host[h] = [r]
            else:
                group.append(r)
        nic, nic_in, nic_out = self.nic, self.nic_in, self.nic_out
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
            if len(group) > 1:
                _, entry = min([(nic_in[nic(d)], d) for d in group])
                rest = [d for d in group if d != entry]
                if k < last:
                    rest = [d for _, d in sorted([(-nic_out[nic(d)], d) for d in rest])]
                group = [entry, *rest]
            order.extend(group)
        return tuple(order)

    def _chain_arrays(self, root: int, receivers: list[int]) -> tuple[int, ...]:
        """:meth:`chain` of many distinct ``receivers`` (sorted) by one sort of arrays:
        by host (the root's first, then by least NIC out load and host), then inside a
        host the entry (least NIC in load, then id) first and the rest by most NIC out
        load then id (in the last host and the root's host when no other follows: by
        id)."""
        d = np.array(receivers, dtype=np.int64)
        host, nic = self.host, self.nic
        hosts = np.fromiter(map(host, receivers), dtype=np.int64, count=len(d))
        nics = [nic(r) for r in receivers]
        out_of, in_of = self.nic_out.get, self.nic_in.get
        sent = np.array([out_of(n, 0.0) for n in nics], dtype=np.float64)
        got = np.array([in_of(n, 0.0) for n in nics], dtype=np.float64)
        rh = host(root)
        local = hosts == rh
        distinct, at = np.unique(hosts, return_inverse=True)
        at = at.reshape(-1)
        least = np.full(len(distinct), np.inf)
        np.minimum.at(least, at, sent)
        remote = distinct != rh
        by_load = np.lexsort((distinct[remote], least[remote]))
        rank = np.full(len(distinct), -1, dtype=np.int64)  # the root's host first
        rank[np.flatnonzero(remote)[by_load]] = np.arange(len(by_load))
        last = len(by_load) - 1
        # each remote host's entry: its least NIC in load, then id
        pick = np.lexsort((d, got, at))
        entry = np.zeros(len(d), dtype=bool)
        first_of = np.ones(len(d), dtype=bool)
        first_of[1:] = at[pick][1:] != at[pick][:-1]
        entry[pick[first_of]] = True
        entry &= ~local
        r = rank[at]
        by_out = (local & (last >= 0)) | (~local & ~entry & (r < last))
        key = np.where(by_out, -sent, 0.0)
        order = np.lexsort((d, key, ~entry, r))
        return tuple(d[order].tolist())

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
            got = self.expected[(direction, self.nic(member))] > \
                self._floor(direction, self.host(member)) * (1 + 1e-9) + 1
            self._may_relay[key] = got
        return got

    def _floor(self, direction: str, h: int) -> float:
        """The least bytes any NIC of host ``h`` is expected to carry in ``direction``
        (expectations are complete before the first choice)."""
        floor = self._least_expected.get((direction, h))
        if floor is None:
            nic = self.nic
            floor = min(self.expected[(direction, nic(d))] for d in self.cluster.hosts[h])
            self._least_expected[(direction, h)] = floor
        return floor

    def relay_chain(self, root: int, receivers: Iterable[int], nbytes: int
                    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """:meth:`chain`, then, on hosts with several NICs, each host boundary crossed
        through the least loaded NIC of the host it leaves and of the host it enters,
        through a device that needs nothing if its NIC is less loaded than every
        chain member's there and the plan's slices as a whole are expected to crowd
        the members' NIC more than it (:meth:`expect`): a relay-only receiver, as
        NCCL's PXN routes through a peer GPU. Relaying costs an intra-host hop, so
        NICs that even out by themselves (an all-to-all) get none. Returns the chain
        and its relay-only devices."""
        receivers = tuple(receivers)
        if len(receivers) == 1:  # point to point: the common case, kept cheap
            r = receivers[0]
            if self.cluster.nics_per_host == 1 or self.host(r) == self.host(root):
                return receivers, ()
            used = {root, r, *self.keep_off.get(root, ())}
            out = self._relay(NIC_OUT, root, self.host(root), used, nbytes)
            into = self._relay(NIC_IN, r, self.host(r), used, nbytes)
            relays = tuple(d for d in (out, into) if d is not None)
            return (*relays, r), relays
        chain = self.chain(root, receivers)
        if self.cluster.nics_per_host == 1 or not chain:
            return chain, ()
        host, nic = self.host, self.nic
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
        members = set(chain)
        used = members | {root, *self.keep_off.get(root, ())}
        through: list[int] = []
        for a, b in itertools.pairwise(segments):
            relay = self._relay(NIC_OUT, a[-1], host(a[-1]), used, nbytes)
            if relay is not None:
                a.append(relay)
            elif len(a) > 2:  # the root stays first; the idlest member leaves last
                last = min(a[1:], key=lambda d: (self.nic_out[nic(d)], d))
                a.remove(last)
                a.append(last)
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

        best = min(free, key=lambda d: (projected(d), load[nic(d)], d))
        if nic(best) == nic(member) or load[nic(best)] >= load[nic(member)] or \
                projected(best) + nbytes > projected(member) or \
                not self._crowded(direction, nic(member), nic(best)) or \
                self._shared_binds(projected(member), nbytes):
            return None
        moved[(direction, nic(best))] += nbytes
        moved[(direction, nic(member))] -= nbytes
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

    def gather(self, senders: Iterable[int], root: int, nbytes: int) -> None:
        """Account ``nbytes`` sent by each of ``senders`` to ``root`` (a reduction's
        addends): :meth:`charge` of each one-hop chain, in one loop (each load gets the
        same additions in the same order)."""
        host, nic = self.host, self.nic
        dev_out, dev_in, nic_out, nic_in = self.dev_out, self.dev_in, self.nic_out, self.nic_in
        root_host, root_nic = host(root), nic(root)
        for d in senders:
            dev_out[d] += nbytes
            dev_in[root] += nbytes
            if host(d) != root_host:
                nic_out[nic(d)] += nbytes
                nic_in[root_nic] += nbytes

    def charge(self, root: int, chain: tuple[int, ...], nbytes: int) -> None:
        """Account a pipelined chain transfer root -> chain[0] -> chain[1] ....

        Each host boundary the chain crosses (:func:`~reshard.planner.values.resources.
        crossings`, walked inline: this runs once per task) charges the NIC it leaves
        through and the one it enters through."""
        if not chain:
            return
        self.dev_out[root] += nbytes
        dev_in = self.dev_in
        for r in chain:
            dev_in[r] += nbytes
        host, nic, nic_out, nic_in = self.host, self.nic, self.nic_out, self.nic_in
        prev, prev_host = root, host(root)
        for d in chain:
            h = host(d)
            if h != prev_host:
                nic_out[nic(prev)] += nbytes
                nic_in[nic(d)] += nbytes
                prev_host = h
            prev = d

"""Sender choice among replicas, balanced per NIC (the scarce resource)."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from reshard.cluster import Cluster


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
        self.host = cluster.host_of
        self.nic = cluster.nic_of

    def pick_root(self, holders: Iterable[int], needer_hosts: set[int] | frozenset[int],
                  nbytes: int) -> int:
        """Choose the holder that sends a slice to devices on ``needer_hosts``.

        Key, lowest first: the holder's NIC out load after this slice (zero extra when
        every needer is on its own host), then whether its host needs the slice itself
        (such a root spares one NIC crossing), then the device's own send load, then id.
        """
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

    def pick_sender(self, holders: Iterable[int], receiver: int, nbytes: int) -> int:
        """Choose the holder that sends a slice point to point to ``receiver``: a holder
        on the receiver's host if there is one, else the least loaded NIC."""
        return self.pick_root(holders, {self.host(receiver)}, nbytes)

    def chain(self, root: int, receivers: Iterable[int]) -> tuple[int, ...]:
        """Order receivers as a broadcast chain: the root's host first, then the other
        hosts by ascending NIC out load (the last host forwards nothing). Inside a
        host, the device whose NIC has received least enters first and the one whose
        NIC has sent least leaves last (they differ only with several NICs per host)."""
        rh = self.host(root)
        by_host: dict[int, list[int]] = {}
        for r in sorted(receivers):
            by_host.setdefault(self.host(r), []).append(r)
        nic, nic_in, nic_out = self.nic, self.nic_in, self.nic_out
        hosts = sorted((h for h in by_host if h != rh),
                       key=lambda h: (min(nic_out[nic(d)] for d in by_host[h]), h))
        order: list[int] = []
        local = by_host.get(rh, [])
        if local:
            if hosts:  # the last local receiver forwards to the next host
                local.sort(key=lambda d: (-nic_out[nic(d)], d))
            order.extend(local)
        for k, h in enumerate(hosts):
            group = by_host[h]
            if len(group) > 1:
                entry = min(group, key=lambda d: (nic_in[nic(d)], d))
                rest = [d for d in group if d != entry]
                if k + 1 < len(hosts):
                    rest.sort(key=lambda d: (-nic_out[nic(d)], d))
                group = [entry, *rest]
            order.extend(group)
        return tuple(order)

    def relay_chain(self, root: int, receivers: Iterable[int]
                    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """:meth:`chain`, then, on hosts with several NICs, each host boundary crossed
        through the least loaded NIC of the host it leaves and of the host it enters,
        through a device that needs nothing if its NIC is less loaded than every
        chain member's there (a relay-only receiver, as NCCL's PXN routes through a
        peer GPU). Returns the chain and its relay-only devices."""
        chain = self.chain(root, receivers)
        if self.cluster.nics_per_host == 1 or not chain:
            return chain, ()
        host, nic, hosts = self.host, self.nic, self.cluster.hosts
        segments: list[list[int]] = [[root]]
        for d in chain:
            if host(d) == host(segments[-1][0]):
                segments[-1].append(d)
            else:
                segments.append([d])
        if len(segments) == 1:
            return chain, ()
        used = set(chain) | {root}
        through: list[int] = []
        for a, b in zip(segments, segments[1:]):
            exit_, entry = a[-1], b[0]
            best = min(hosts[host(exit_)],
                       key=lambda d: (self.nic_out[nic(d)], d not in a, d != exit_, d))
            if nic(best) != nic(exit_) and self.nic_out[nic(best)] < self.nic_out[nic(exit_)]:
                if best in a:
                    if best != a[0]:  # the root stays first
                        a.remove(best)
                        a.append(best)
                elif best not in used:
                    a.append(best)
                    used.add(best)
                    through.append(best)
            best = min(hosts[host(entry)],
                       key=lambda d: (self.nic_in[nic(d)], d not in b, d != entry, d))
            if nic(best) != nic(entry) and self.nic_in[nic(best)] < self.nic_in[nic(entry)]:
                if best in b:
                    b.remove(best)
                    b.insert(0, best)
                elif best not in used:
                    b.insert(0, best)
                    used.add(best)
                    through.append(best)
        order = tuple(d for seg in segments for d in seg)[1:]
        return order, tuple(through)

    def charge(self, root: int, chain: tuple[int, ...], nbytes: int) -> None:
        """Account a pipelined chain transfer root -> chain[0] -> chain[1] ...."""
        if not chain:
            return
        self.dev_out[root] += nbytes
        host, nic = self.host, self.nic
        prev, prev_host = root, host(root)
        for r in chain:
            self.dev_in[r] += nbytes
            h = host(r)
            if h != prev_host:
                self.nic_out[nic(prev)] += nbytes
                self.nic_in[nic(r)] += nbytes
            prev, prev_host = r, h

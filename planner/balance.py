"""Sender choice among replicas, balanced per host NIC (the scarce resource)."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from reshard.cluster import Cluster


class Loads:
    """Bytes assigned so far to each host NIC (per direction) and each device.

    A planning-call-local accumulator: :func:`reshard.planner.plan.plan_many` creates
    one, assigns the largest slices first, and each choice picks the holder that keeps
    the most loaded resource lowest.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.nic_out: defaultdict[int, float] = defaultdict(float)
        self.nic_in: defaultdict[int, float] = defaultdict(float)
        self.dev_out: defaultdict[int, float] = defaultdict(float)
        self.dev_in: defaultdict[int, float] = defaultdict(float)

    def host(self, device: int) -> int:
        """Host of a device."""
        return self.cluster.host_of(device)

    def pick_root(self, holders: Iterable[int], needer_hosts: set[int], nbytes: int) -> int:
        """Choose the holder that sends a slice to devices on ``needer_hosts``.

        Key, lowest first: the holder's NIC out load after this slice (zero extra when
        every needer is on its own host), then whether its host needs the slice itself
        (such a root spares one NIC crossing), then the device's own send load, then id.
        """
        best_key = None
        best = -1
        for d in holders:
            h = self.host(d)
            extra = nbytes if needer_hosts - {h} else 0
            key = (self.nic_out[h] + extra, h not in needer_hosts, self.dev_out[d], d)
            if best_key is None or key < best_key:
                best_key, best = key, d
        return best

    def pick_sender(self, holders: Iterable[int], receiver: int, nbytes: int) -> int:
        """Choose the holder that sends a slice point to point to ``receiver``: a holder
        on the receiver's host if there is one, else the least loaded NIC."""
        return self.pick_root(holders, {self.host(receiver)}, nbytes)

    def chain(self, root: int, receivers: Iterable[int]) -> tuple[int, ...]:
        """Order receivers as a broadcast chain: the root's host first, then the other
        hosts by ascending NIC out load (the last host forwards nothing)."""
        rh = self.host(root)
        by_host: dict[int, list[int]] = {}
        for r in sorted(receivers):
            by_host.setdefault(self.host(r), []).append(r)
        hosts = sorted((h for h in by_host if h != rh), key=lambda h: (self.nic_out[h], h))
        order = by_host.get(rh, [])
        for h in hosts:
            order = order + by_host[h]
        return tuple(order)

    def charge(self, root: int, chain: tuple[int, ...], nbytes: int) -> None:
        """Account a pipelined chain transfer root -> chain[0] -> chain[1] ...."""
        if not chain:
            return
        self.dev_out[root] += nbytes
        hosts = [self.host(root)]
        for r in chain:
            self.dev_in[r] += nbytes
            h = self.host(r)
            if h != hosts[-1]:
                hosts.append(h)
        for a, b in zip(hosts, hosts[1:]):
            self.nic_out[a] += nbytes
            self.nic_in[b] += nbytes

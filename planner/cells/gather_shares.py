"""A reduction's addends accounted in bulk: every share of one partial-sum box that a
group reduces, charged to the loads at once with the sums of the per-share additions.

:func:`gather` of each share adds the share's
bytes once per addend to the same few loads; a box of a 1,024-device group reduced in
1,024 shares makes a million such additions. Exactness: the shares' additions are
whole byte counts, and nothing reads the loads between them (the shares are cut from
the box alone), so where a load holds a whole number and stays below 2**53 with all of
them added, every partial sum is a whole number below 2**53, exact in a float, and one
addition of the whole-number total gives the same float as the additions one by one.
Where some load is not a whole number, or would not stay below 2**53, the shares are
gathered one by one as before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from reshard.planner.cells.balance import Loads
from reshard.planner.cells.whole_sums import EXACT

COUNT_FROM = 16
"""Roots from which :func:`_totals` counts each member's times in the group once (a
1,024-device group's 1,024 roots: one pass, not one ``tuple.count`` of the group a
root: 78 ms of RR+P01 -> RS0 at 1,024 devices); fewer, it counts per root."""


def gather_shares(loads: Loads, group: tuple[int, ...],
                  shares: list[tuple[int, int]]) -> None:
    """Account each ``(root, nbytes)`` of ``shares`` as ``gather(loads, others, root,
    nbytes)`` would, ``others`` being ``group``'s members but ``root`` (each once),
    with the same result in every load (module docstring)."""
    if not shares:
        return
    totals = _totals(loads, group, shares)
    tables = (loads.dev_out, loads.dev_in, loads.nic_out, loads.nic_in)
    for table, adds in zip(tables, totals):
        for key, add in adds.items():
            cur = table[key]
            if not (cur.is_integer() and abs(cur) + add < EXACT):
                for root, nbytes in shares:
                    gather(loads, tuple(d for d in group if d != root), root, nbytes)
                return
    for table, adds in zip(tables, totals):
        for key, add in adds.items():
            table[key] += add


def gather(loads: Loads, senders: Iterable[int], root: int, nbytes: int) -> None:
    """Account ``nbytes`` sent by each of ``senders`` to ``root`` (a reduction's
    addends): :meth:`Loads.charge` of each one-hop chain, in one loop (each load gets
    the same additions in the same order)."""
    host, nic = loads.host, loads.nic
    dev_out, dev_in, nic_out, nic_in = loads.dev_out, loads.dev_in, loads.nic_out, loads.nic_in
    root_host, root_nic = host(root), nic(root)
    for d in senders:
        dev_out[d] += nbytes
        dev_in[root] += nbytes
        if host(d) != root_host:
            nic_out[nic(d)] += nbytes
            nic_in[root_nic] += nbytes


def _totals(loads: Loads, group: tuple[int, ...], shares: list[tuple[int, int]]
            ) -> tuple[dict[int, int], dict[int, int], dict[int, int], dict[int, int]]:
    """What the shares add to each device's and NIC's loads, as whole numbers: per
    sender, every share it is not the root of; per root, its shares times its
    addends; per NIC out, every share whose root is on another host than the
    sender; per NIC in, a root's shares times its addends on other hosts."""
    host, nic = loads.host, loads.nic
    total = sum(nbytes for _, nbytes in shares)
    by_root: dict[int, int] = {}
    by_root_host: dict[int, int] = {}
    for root, nbytes in shares:
        by_root[root] = by_root.get(root, 0) + nbytes
        h = host(root)
        by_root_host[h] = by_root_host.get(h, 0) + nbytes
    on_host: dict[int, int] = {}
    dev_out: dict[int, int] = {}
    nic_out: dict[int, int] = {}
    for d in group:
        h = host(d)
        on_host[h] = on_host.get(h, 0) + 1
        dev_out[d] = dev_out.get(d, 0) + total - by_root.get(d, 0)
        n = nic(d)
        nic_out[n] = nic_out.get(n, 0) + total - by_root_host.get(h, 0)
    dev_in: dict[int, int] = {}
    nic_in: dict[int, int] = {}
    times = Counter(group).__getitem__ if len(by_root) >= COUNT_FROM else group.count
    for root, nbytes in by_root.items():
        dev_in[root] = nbytes * (len(group) - times(root))
        n = nic(root)
        nic_in[n] = nic_in.get(n, 0) + nbytes * (len(group) - on_host.get(host(root), 0))
    return dev_out, dev_in, nic_out, nic_in


__all__ = ["gather", "gather_shares"]

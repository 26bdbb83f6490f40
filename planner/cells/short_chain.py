"""A short chain to other hosts, ordered and walked at once.

:meth:`Loads.relay_chain <reshard.planner.cells.balance.Loads.relay_chain>` of a few
receivers (fewer than :data:`~reshard.planner.cells.balance.ARRAY_CHAIN`) orders them
(:meth:`Loads.chain`) and then walks the chain's host segments (:meth:`Loads._relay_walk`),
cutting the chain it has just built back into the groups it built it from. Where none of
the receivers is on the root's host (every cell of a 4x8 ``RS1`` or ``RR``
destination from a replicated source on other hosts), :func:`remote_chain` does
both in one pass over the groups: the same order, read from the same loads in the same
way, and the segments the walk would cut (the root's alone, then one per host, as
chained). Where no boundary may relay (:meth:`Loads.may_relay_end`) it returns the
walk's quick answer (:func:`~reshard.planner.cells.chain_arrays.idlest_last`); else the
chain, for the walk."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from reshard.planner.cells.chain_arrays import Loads, idlest_last
from reshard.planner.values.resources import NIC_IN, NIC_OUT

Split = tuple[frozenset[int], tuple[tuple[int, tuple[tuple[int, int], ...]], ...]]
"""A few receivers by host (:func:`split_hosts`): their hosts, and each host with its
receivers' (device, NIC) pairs in id order, the hosts in the order their first
receivers come in id order."""


def split_hosts(host: Callable[[int], int], nic: Callable[[int], int], group: list[int]
                ) -> Split:
    """``group``'s (sorted receivers) :data:`Split` (it reads only the cluster)."""
    by_host: dict[int, list[tuple[int, int]]] = {}
    for d in group:
        h = host(d)
        got = by_host.get(h)
        if got is None:
            by_host[h] = [(d, nic(d))]
        else:
            got.append((d, nic(d)))
    return frozenset(by_host), tuple((h, tuple(pairs)) for h, pairs in by_host.items())


def remote_chain(loads: Loads, root: int, group: list[int], split: Split | None = None
                 ) -> tuple[tuple[int, ...], tuple[int, ...] | None] | None:
    """``group`` (sorted receivers, a few) ordered as :meth:`Loads.chain` orders them,
    and :meth:`Loads._relay_walk`'s answer where no host boundary may relay (else
    None: walk the chain); None where some receiver is on the root's host.
    ``split``: ``group``'s :func:`split_hosts`, if found.

    Exact: :meth:`Loads.chain` with no receiver on the root's host groups them by
    host (each group in ``group``'s order), orders the hosts by (least NIC out load of
    the group, host), enters each host by its least (NIC in load, id) and, but for the
    last host, orders the rest by (-NIC out load, id), as below, with the same
    subscripts of the same tables in the same order (an unseen NIC's key added where
    it adds it). Its chain is those groups one after another, so the walk's segments
    are the root alone and then each group; the walk's quick test asks each segment's
    last but the last's (``NIC_OUT``) and each segment's first but the root's
    (``NIC_IN``), and then does :func:`idlest_last`'s moves."""
    hosts, groups = split_hosts(loads.host, loads.nic, group) if split is None else split
    if not groups or loads.host(root) in hosts:
        return None
    nic_in, nic_out = loads.nic_in, loads.nic_out
    may = loads.may_relay_end
    if len(groups) == 1:  # one other host: its entry, then the rest
        pairs = groups[0][1]
        _, entry = min([(nic_in[n], d) for d, n in pairs])
        chain = (entry, *[d for d, _ in pairs if d != entry])
        return chain, None if may(NIC_OUT, root) or may(NIC_IN, entry) else chain
    # (the least NIC out load, host, pairs): hosts differ, so pairs are never compared
    order = sorted([(min([nic_out[n] for _, n in pairs]), h, pairs) for h, pairs in groups])
    last = len(order) - 1
    segments: list[list[int]] = [[root]]
    for k, (_, _, pairs) in enumerate(order):
        segments.append(_entered(pairs, nic_in, nic_out, k < last) if len(pairs) > 1
                        else [pairs[0][0]])
    chain = tuple([d for seg in segments[1:] for d in seg])
    # each segment's last but the last's, then each one's first but the root's: the
    # walk's questions in its order, the first yes ending them (as ``any`` would)
    # (each answer read from may_relay_end's cache where it has one)
    cached = loads._may_relay
    for k in range(last + 1):
        d = segments[k][-1]
        relays = cached.get((NIC_OUT, d))
        if relays or (relays is None and may(NIC_OUT, d)):
            return chain, None
    for k in range(1, last + 2):
        d = segments[k][0]
        relays = cached.get((NIC_IN, d))
        if relays or (relays is None and may(NIC_IN, d)):
            return chain, None
    return chain, idlest_last(segments, nic_out, loads.nic)


def _entered(pairs: tuple[tuple[int, int], ...], nic_in: Mapping[int, float],
             nic_out: Mapping[int, float], forwards: bool) -> list[int]:
    """:func:`entered` of one host's receivers given as (device, NIC) pairs: the same
    order, the same subscripts in the same order."""
    _, entry = min([(nic_in[n], d) for d, n in pairs])
    if forwards:
        return [entry, *[d for _, d in sorted([(-nic_out[n], d) for d, n in pairs
                                               if d != entry])]]
    return [entry, *[d for d, _ in pairs if d != entry]]


def entered(group: list[int], nic_in: Mapping[int, float], nic_out: Mapping[int, float],
            nic: Callable[[int], int], forwards: bool) -> list[int]:
    """One host's receivers (two or more) in chain order, as :meth:`Loads.chain` and
    :func:`remote_chain` both order them: the least (NIC in load, id) enters; where the
    host forwards to a next one, the rest by (-NIC out load, id) (the last of them, the
    least loaded sender, forwards), else in ``group``'s order."""
    _, entry = min([(nic_in[nic(d)], d) for d in group])
    rest = [d for d in group if d != entry]
    if forwards:
        rest = [d for _, d in sorted([(-nic_out[nic(d)], d) for d in rest])]
    return [entry, *rest]


__all__ = ["Split", "entered", "remote_chain", "split_hosts"]

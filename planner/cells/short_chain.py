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


def remote_chain(loads: Loads, root: int, group: list[int]
                 ) -> tuple[tuple[int, ...], tuple[int, ...] | None] | None:
    """``group`` (sorted receivers, a few) ordered as :meth:`Loads.chain` orders them,
    and :meth:`Loads._relay_walk`'s answer where no host boundary may relay (else
    None: walk the chain); None where some receiver is on the root's host.

    Exact: :meth:`Loads.chain` with no receiver on the root's host groups them by
    host (each group in ``group``'s order), orders the hosts by (least NIC out load of
    the group, host), enters each host by its least (NIC in load, id) and, but for the
    last host, orders the rest by (-NIC out load, id), as below, with the same
    subscripts of the same tables. Its chain is those groups one after another, so the
    walk's segments are the root alone and then each group; the walk's quick test asks
    each segment's last but the last's (``NIC_OUT``) and each segment's first but the
    root's (``NIC_IN``), and then does :func:`idlest_last`'s moves."""
    host, nic, nic_in, nic_out = loads.host, loads.nic, loads.nic_in, loads.nic_out
    hs = list(map(host, group))
    if not hs or host(root) in hs:
        return None
    may = loads.may_relay_end
    if hs.count(hs[0]) == len(hs):  # one other host: its entry, then the rest
        _, entry = min([(nic_in[nic(d)], d) for d in group])
        chain = (entry, *[d for d in group if d != entry])
        return chain, None if may(NIC_OUT, root) or may(NIC_IN, entry) else chain
    by_host: dict[int, list[int]] = {}
    for r, h in zip(group, hs):
        got = by_host.get(h)
        if got is None:
            by_host[h] = [r]
        else:
            got.append(r)
    hosts = [h for _, h in sorted((min([nic_out[nic(d)] for d in g]), h)
                                  for h, g in by_host.items())]
    last = len(hosts) - 1
    segments: list[list[int]] = [[root]]
    for k, h in enumerate(hosts):
        g = by_host[h]
        segments.append(entered(g, nic_in, nic_out, nic, k < last) if len(g) > 1 else g)
    chain = tuple([d for seg in segments[1:] for d in seg])
    # each segment's last but the last's, then each one's first but the root's: the
    # walk's questions in its order, the first yes ending them (as ``any`` would)
    for k in range(last + 1):
        if may(NIC_OUT, segments[k][-1]):
            return chain, None
    for k in range(1, last + 2):
        if may(NIC_IN, segments[k][0]):
            return chain, None
    return chain, idlest_last(segments, nic_out, nic)


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


__all__ = ["entered", "remote_chain"]

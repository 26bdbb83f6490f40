"""Short chains to other hosts kept by the order of the loads that decide them: a run's
cells to the same receivers whose receivers' NIC loads rank alike take one chain.

:func:`~reshard.planner.cells.cell_tasks.plan_broadcast` of a cell with one holder (its
root) and a few receivers (two or more, fewer than
:data:`~reshard.planner.cells.balance.ARRAY_CHAIN`) on two or more hosts, none the
root's, on hosts with several NICs, takes
:func:`~reshard.planner.cells.short_chain.remote_chain`'s quick chain where no host
boundary may relay (:meth:`Loads.may_relay_end`), and :meth:`Loads.charge` of it. That
chain reads the receivers' hosts and NICs (fixed), whether the root's NIC out and
some receivers' NICs may relay (each answer fixed once asked: cached), and comparisons
among the receivers' NIC out loads and among their NIC in loads, nothing else: not the
root, not the bytes. The loads' dense ranks keep every such comparison, ties included,
so a later cell to the same receivers whose loads rank as a kept cell's did orders
them the same way and asks the same receivers the same questions, which the kept
cell's answers already said no to (cached): it takes the kept chain, once its root's
NIC out may not relay (asked first, as :func:`remote_chain` asks it). Every cell of a
partial sum's reduced pieces sent to the 32 devices of a 4x8 ``RR`` destination is
such a cell: 640 cells of a request, 32 rankings each run (the loads rotate).
"""

from __future__ import annotations

import itertools

from reshard.planner.cells.balance import ARRAY_CHAIN, Loads
from reshard.planner.cells.chain_memo import INDEX_RANKS, Reader, _reader
from reshard.planner.cells.decompose import Cell
from reshard.planner.cells.holder_arrays import ARRAY_HOLDERS
from reshard.planner.cells.new_tasks import new_task
from reshard.planner.cells.short_chain import remote_chain
from reshard.planner.values.resources import NIC_OUT
from reshard.planner.values.tasks import Task, TaskKind


class Receivers:
    """A receiver set's fixed facts (its devices in id order, its hosts, its NICs and
    a reader of their loads) and its kept chains by the ranks of those loads."""

    def __init__(self, group: list[int], hosts: frozenset[int], nics: list[int]) -> None:
        self.group = group
        self.hosts = hosts
        self.nics = nics
        self.read: Reader = _reader(nics)
        self.few = len(nics) <= INDEX_RANKS  # (_ranks by a scan)
        self.seen = False  # every NIC's loads written to both tables (read below)
        self.chains: dict[tuple[tuple[int, ...], tuple[int, ...]], Kept] = {}


Kept = tuple[tuple[int, ...], int, list[tuple[int, int]]]
"""A kept chain, the NIC its first receiver enters through and each later host
boundary's NICs (the one it leaves through, the one it enters through), as
:meth:`Loads.charge` walks them."""


def _kept(loads: Loads, chain: tuple[int, ...]) -> Kept:
    """``chain`` (its first receiver on another host than the root's) as kept."""
    host, nic = loads.host, loads.nic
    crossings = [(nic(a), nic(b)) for a, b in itertools.pairwise(chain) if host(a) != host(b)]
    return chain, nic(chain[0]), crossings


class KeptChains:
    """One run's kept chains (:func:`~reshard.planner.cells.cell_tasks.plan_broadcasts`'
    cells in turn, on one :class:`Loads`), per receiver set."""

    def __init__(self, loads: Loads) -> None:
        self.loads = loads
        self.receivers: dict[frozenset[int], Receivers | None] = {}

    def _facts(self, needers: frozenset[int]) -> Receivers | None:
        """``needers``' :class:`Receivers` where :func:`remote_chain` may order them
        (two or more, fewer than ``ARRAY_CHAIN``, on two or more hosts with several
        NICs each); else None. Found once per set."""
        if needers in self.receivers:
            return self.receivers[needers]
        loads = self.loads
        got = None
        if 1 < len(needers) < ARRAY_CHAIN and loads.cluster.nics_per_host > 1:
            group = sorted(needers)
            hosts = frozenset(map(loads.host, group))
            nics = sorted({loads.nic(d) for d in group})
            if len(hosts) > 1 and len(nics) > 1:  # (hosts apart have NICs apart)
                got = Receivers(group, hosts, nics)
        self.receivers[needers] = got
        return got

    def plan(self, cell: Cell, tensor: int, itemsize: int, step: int) -> list[Task] | None:
        """:func:`~reshard.planner.cells.cell_tasks.plan_broadcast` of ``cell`` (one
        holder) where it takes :func:`remote_chain`'s quick chain, that chain kept
        for later cells whose loads rank alike; else None, having changed nothing but
        cached answers to whether the root's NIC out may relay (the planner's first
        question of it)."""
        needers = cell.needers
        facts = self.receivers[needers] if needers in self.receivers else \
            self._facts(needers)
        if facts is None:
            return None
        (root,) = cell.holders
        return self._from(facts, needers, root, cell, tensor, itemsize, step)

    def plan_held(self, cell: Cell, tensor: int, itemsize: int, step: int
                  ) -> list[Task] | None:
        """:meth:`plan` of a cell of several holders (fewer than
        :data:`~reshard.planner.cells.holder_arrays.ARRAY_HOLDERS`) none of which needs
        it: :func:`~reshard.planner.cells.cell_tasks.plan_broadcast` picks its root
        (:meth:`Loads.pick_root`, which only reads the loads) and then plans the chain
        from that root to the needers as :meth:`plan` does for a one-holder cell (the
        chain reads neither the root nor the bytes but the root's host and whether its
        NIC out may relay). Else None, having changed nothing but cached answers and
        the unseen keys :meth:`Loads.pick_root` reads (that the planner, asking it
        again, reads in the same order)."""
        needers, holders = cell.needers, cell.holders
        facts = self.receivers[needers] if needers in self.receivers else \
            self._facts(needers)
        if facts is None or len(holders) >= ARRAY_HOLDERS or not needers.isdisjoint(holders):
            return None
        # plan_broadcast's root: the needers' hosts (a frozenset here, a set there)
        # are only tested for membership below ARRAY_HOLDERS holders
        root = self.loads.pick_root(holders, facts.hosts, cell.size * itemsize)
        return self._from(facts, needers, root, cell, tensor, itemsize, step)

    def _from(self, facts: Receivers, needers: frozenset[int], root: int, cell: Cell,
              tensor: int, itemsize: int, step: int) -> list[Task] | None:
        """:meth:`plan`'s chain from ``root`` to ``needers`` (``facts``)."""
        loads = self.loads
        if loads.host(root) in facts.hosts:
            return None
        # loads.may_relay_end(NIC_OUT, root), its cached answer read here
        relays = loads._may_relay.get((NIC_OUT, root))
        if relays is None:
            relays = loads.may_relay_end(NIC_OUT, root)
        if relays:
            return None  # the walk decides (remote_chain asks this first)
        nic_out, nic_in = loads.nic_out, loads.nic_in
        if not facts.seen:  # reading an unseen NIC would add its key: leave that to
            # the planner, which adds them in its own order (a cell or so)
            if not all(n in nic_out and n in nic_in for n in facts.nics):
                return None
            facts.seen = True
        read = facts.read
        if facts.few:  # _ranks of each, inline (its scan of the sorted distinct values)
            out, into = read(nic_out), read(nic_in)
            key = (tuple(map(sorted(set(out)).index, out)),
                   tuple(map(sorted(set(into)).index, into)))
        else:  # its table of ranks, inline
            out, into = read(nic_out), read(nic_in)
            outs, ins = sorted(set(out)), sorted(set(into))
            key = (tuple(map(dict(zip(outs, range(len(outs)))).__getitem__, out)),
                   tuple(map(dict(zip(ins, range(len(ins)))).__getitem__, into)))
        kept = facts.chains.get(key)
        if kept is None:
            # (the receivers' split by host read from the loads' memo: the same
            # split_hosts of the same sorted group, found once per set)
            short = remote_chain(loads, root, *loads._needers.grouped(loads, needers))
            if short is None or short[1] is None:
                return None
            kept = facts.chains[key] = _kept(loads, short[1])
        chain, entry, crossings = kept
        nbytes = cell.size * itemsize
        if loads.nic_mirror is not None:  # (none outside plan_broadcasts' long chains)
            loads.charge(root, chain, nbytes)
        else:  # Loads.charge's additions, in its order, its walk kept
            loads.dev_out[root] += nbytes
            dev_in = loads.dev_in
            for r in chain:
                dev_in[r] += nbytes
            nic_out[loads.nic(root)] += nbytes
            nic_in[entry] += nbytes
            for a, b in crossings:
                nic_out[a] += nbytes
                nic_in[b] += nbytes
        return [new_task(TaskKind.BROADCAST, tensor, cell.box, root, chain, nbytes, step)]


__all__ = ["KeptChains", "Receivers"]

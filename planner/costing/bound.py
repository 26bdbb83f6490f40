"""The lower bound of a move: no plan is faster than the largest of: the bytes a host
must receive that none of its devices holds, over its NIC bandwidth; the bytes leaving a set of hosts
that alone hold some slices needed elsewhere, over their NICs; the bytes a device must
receive that it does not hold, over its link; the bytes all devices must receive that
they do not hold, over the shared bandwidth (if any); the bytes a host's devices must
take in, over their links and the host's NICs (a sum's addends merged elsewhere leave
through those); plus one latency. A partial sum of two or more addends is held by no
device (an addend holds a part of it) and by a host only if one whole group of its
addends lies inside it; summing ``k`` addends takes ``k - 1`` moves of each element, on
a host holding a whole group: a reduce-scatter over one host's eight GPUs is bound by
7/8 of the tensor over their links (NCCL's bus bandwidth), not by the 1/8 each receives.
A host's intake pays its hops (:func:`ingress_time`): merging addends and spreading a
byte to the host's other devices are hops, and a byte that skips one crosses the NICs
once per addend or once per device needing it. Where the cluster prices casts on the
wire (``Cluster.cast_bandwidth``), the source bytes held only by a set of devices are
converted by those devices, each at that rate, before they leave: no plan is faster
than that either (:meth:`_Intake._conversions`).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from reshard.cluster import Cluster
from reshard.dtypes import itemsize
from reshard.layout import box_size
from reshard.planner.cells.decompose import (
    TABLE_FROM,
    Cell,
    CellTable,
    decompose,
    decompose_table,
    devices_by_box,
)
from reshard.planner.costing.casts import converts
from reshard.planner.costing.cost import edge_pieces
from reshard.planner.values.tasks import TensorSpec


def ingress_time(busy: float, addends: int, needers: int, hop: float) -> float:
    """Least seconds after the first byte can arrive for a host to take in bytes that
    keep its NICs ``busy`` seconds, when each is a sum of at least ``addends`` values
    held outside it and needed by at least ``needers`` of its devices, and a hop
    between two devices costs ``hop`` seconds.

    Merging two addends is a hop, so in the first ``hop`` seconds only raw addends
    arrive: an element then costs ``addends`` crossings. Spreading a byte to another
    device is a hop, so in the last ``hop`` seconds a byte reaches only the device it
    enters by: it costs ``needers`` crossings. In between each byte crosses once (the
    host takes it in, merged, then spreads it). The time to take in ``busy`` seconds'
    worth of bytes at those costs (both in a window of both): the bytes done by
    ``tau`` after the first arrival are ``tau / (k g)`` up to ``hop``, then up to
    ``2 hop`` ``hop / (k g) + (tau - hop) (1 / k + 1 / g - 1 / (k g))``, then one per
    second. With one addend and one needer it is ``busy``.
    """
    k, g = max(1, addends), max(1, needers)
    if hop <= 0 or (k == 1 and g == 1):
        return busy
    first = hop / (k * g)  # done by tau = hop
    second = hop / k + hop / g  # done by tau = 2 hop
    if busy <= first:
        return busy * k * g
    if busy <= second:
        return hop + (busy - first) * hop / (second - first)
    return 2 * hop + busy - second


def _cell_groups(t: TensorSpec, cells: list[Cell] | CellTable | None = None
                 ) -> dict[tuple[frozenset[int], frozenset[int]], int]:
    """Elements of tensor ``t`` by (holders, needers): its unit slices' boxes summed
    per pair of device sets (what every term of the bound depends on). ``cells``: its
    source's cells as the planner cut them (a plain source's: the same decomposition),
    else found here."""
    out: dict[tuple[frozenset[int], frozenset[int]], int] = {}
    if cells is None:
        holders = devices_by_box(t.src, t.shape)
        needers = devices_by_box(t.dst, t.shape, t.dst.partial_leaders())
        if len(holders) * len(needers) >= TABLE_FROM:
            cells = decompose_table(t.shape, holders, needers)
        else:
            cells = decompose(t.shape, holders, needers)
    if isinstance(cells, CellTable):
        table = cells
        for h, n, size in zip(table.holder.tolist(), table.needer.tolist(),
                              table.size.tolist()):
            key = (table.holder_sets[h], table.needer_sets[n])
            out[key] = out.get(key, 0) + size
        return out
    for c in cells:
        key = (frozenset(c.holders), frozenset(c.needers))
        out[key] = out.get(key, 0) + box_size(c.box)
    return out


@dataclass(frozen=True)
class _Needs:
    """A needer set's devices in its own order, each one's host, the set of those
    hosts, the needers per host and the needers by host (:meth:`_Intake._needs`)."""

    order: list[int]
    hosts: list[int]
    host_set: set[int]
    frozen: frozenset[int]  # host_set
    per_host: dict[int, int]
    by_host: dict[int, list[int]]


def lower_bound(tensors: Sequence[TensorSpec], cluster: Cluster,
                cells: Sequence[list[Cell] | CellTable | None] | None = None) -> float:
    """Seconds no plan moving ``tensors`` can beat on ``cluster``. ``cells``: per
    tensor, its plain source's cells as the planner cut them (None: found here)."""
    intake = _Intake(cluster)
    for i, t in enumerate(tensors):
        intake.add(t, None if cells is None else cells[i])
    return intake.bound()


_SUBSET_SETS = 256
"""Holder sets of converted bytes up to which the bound's conversion term also gives
each set the bytes of its subsets (quadratic in the sets)."""


class _Intake:
    """What the lower bound's terms count, tensor by tensor: the bytes each host and
    device must take in, copy, or send out (module docstring)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.host_in: dict[int, float] = {}
        self.dev_in: dict[int, float] = {}
        self.dev_copy: dict[int, float] = {}
        self.leave: dict[frozenset[int], list[tuple[frozenset[int], float]]] = {}
        # bytes a host's devices must take in (or its NICs send out, for sums merged
        # elsewhere), and the extra moves every merge of a sum costs (for the shared term)
        self.host_take: dict[int, float] = {}
        # per host: the fewest addends and the fewest of its needers any byte it takes in
        # has (the cost of skipping the merge before, or the spread after, the NIC)
        self.host_least: dict[int, tuple[int, int]] = {}
        self.merged = 0.0
        self.near: set[int] = set()  # devices some of whose bytes may come from their own host
        self.sums_to: set[int] = set()  # devices needing a sum (an all-reduce may bring it)
        # where messages cost (Cluster.message_cost, on a shared bandwidth): each
        # device's holder sets
        self.roots: dict[int, set[frozenset[int]]] | None = \
            {} if cluster.message_cost and cluster.shared_bandwidth else None
        self.host_of = cluster.host_map.__getitem__  # a plain lookup: a hot loop
        # source bytes a cast on the wire converts, by the devices holding them (where
        # the cluster prices conversions: Cluster.cast_bandwidth)
        self.convert: dict[frozenset[int], float] = {}
        # each needer set's hosts (:meth:`_needs`), found once: cells share them
        self.needs: dict[frozenset[int], _Needs] = {}
        self.hold_hosts: dict[frozenset[int], frozenset[int]] = {}  # per holder set
        # per needer set (and, for a sum, addends and holder hosts): the hosts whose
        # least it has taken (:meth:`_host_in`)
        self.least_taken: dict[object, set[int]] = {}
        # plain cells of one needer set in a row, counted into dev_in and host_take at
        # once when another cell or the bound reads them (:meth:`_receive`, :meth:`settle`)
        self.run_needs: _Needs | None = None
        self.run_bytes: list[float] = []

    def add(self, t: TensorSpec, cells: list[Cell] | CellTable | None = None) -> None:
        """Count tensor ``t``'s cells (``cells``: :func:`_cell_groups`')."""
        host_of = self.host_of
        # A partial source whose groups have two or more addends is a sum no device
        # holds: a needer receives every element of it at least once (from another
        # addend, or the sum), so it counts as received even by an addend; a host
        # holds it only if one whole group lies inside it.
        groups = t.src.partial_groups() if t.src.spec.partial else []
        summed = any(len(g) > 1 for g in groups)
        # each addend's group, and the one host holding all of it (None: several)
        sum_host: dict[int, int | None] = {}
        for g in groups:
            hosts = {host_of(d) for d in g}
            one = next(iter(hosts)) if len(hosts) == 1 else None
            for d in g:
                sum_host[d] = one
        size = min((len(g) for g in groups), default=1)  # addends per group
        item = t.itemsize
        # a needed element is converted by one of its holders (a partial sum's, where it
        # lands: neither the model nor the bound prices that)
        src_item = itemsize(t.dtype) if self.cluster.cast_bandwidth and converts(t) \
            and not t.src.spec.partial else 0
        for (holders, needers), elements in _cell_groups(t, cells).items():
            if src_item:
                self.convert[holders] = self.convert.get(holders, 0.0) + elements * src_item
            if not summed and len(holders) == 1 and len(needers) == 1:
                self._pair(next(iter(holders)), next(iter(needers)), elements * item)
                continue
            # the hosts holding a whole group of the cell's addends (None: a group
            # spread over hosts)
            inside: set[int | None] = {sum_host[d] for d in holders} if summed else set()
            self._cell(holders, needers, elements * item, size if summed else 0, inside)

    def _pair(self, s: int, d: int, nbytes: float) -> None:
        """:meth:`_cell` of a cell group one device holds and one needs (an all-to-all's
        every cell): the same counts without building its sets."""
        self.settle()
        if s == d:
            self.dev_copy[d] = self.dev_copy.get(d, 0.0) + nbytes
            return
        hs, hd = self.host_of(s), self.host_of(d)
        if hs != hd:
            self.host_in[hd] = self.host_in.get(hd, 0.0) + nbytes
            self.host_least[hd] = (1, 1)  # one holder, one needer: the least there is
        self.dev_in[d] = self.dev_in.get(d, 0.0) + nbytes
        self.host_take[hd] = self.host_take.get(hd, 0.0) + nbytes
        if self.roots is not None:
            self.roots.setdefault(d, set()).add(frozenset((s,)))
        if hs == hd:
            self.near.add(d)
        else:
            self.leave.setdefault(frozenset((hs,)), []).append((frozenset((hd,)), nbytes))

    def _cell(self, holders: frozenset[int], needers: frozenset[int], nbytes: float,
              size: int, inside: set[int | None]) -> None:
        """Count one cell group's ``nbytes`` (after any cast: what the wire carries);
        ``size``: addends per group of a summed source (0: not a sum)."""
        host_of, summed = self.host_of, size > 0
        hold_hosts = self.hold_hosts.get(holders)
        if hold_hosts is None:
            hold_hosts = self.hold_hosts[holders] = frozenset(host_of(d) for d in holders)
        needs = self._needs(needers)
        need_hosts = needs.host_set
        summing = {h for h in inside if h is not None} if summed else hold_hosts
        self._host_in(needers, needs, hold_hosts, summing, size, nbytes)
        if not summed and self.roots is None and holders.isdisjoint(needers):
            self._receive(needs, nbytes, hold_hosts)
        else:
            self._receive_each(holders, needers, nbytes, summed, summing)
        if summed and needers:
            # Summing ``size`` addends takes size - 1 moves of each element (each
            # merges two partial values on one device) and every needer but the
            # one holding the sum receives it: size - 2 moves beyond the needers'.
            self.merged += (size - 2) * nbytes
            one = next(iter(inside)) if len(inside) == 1 else None
            if one is not None:
                # every group in one host: each merge lands on one of its devices or
                # needs an addend to leave it through its NICs, and its needers'
                # receipts above count one too many when the sum ends on one of them
                local = sum(1 for d in needers if host_of(d) == one)
                self.host_take[one] = self.host_take.get(one, 0.0) + nbytes * (
                    size - 1 - (1 if local else 0))
        if need_hosts - hold_hosts:
            self.leave.setdefault(hold_hosts, []).append((needs.frozen, nbytes))

    def _host_in(self, needers: frozenset[int], needs: _Needs, hold_hosts: frozenset[int],
                 summing: set[int] | frozenset[int], size: int, nbytes: float) -> None:
        """Count a cell's ``nbytes`` into each needing host that does not sum it
        (``summing``), and each one's fewest addends and needers (``host_least``).

        A host's least is taken once per needer set (and, for a sum, its addends and
        holder hosts), which determine the values it is taken with: taken again with
        the same values, a minimum changes nothing, and its key is in
        (:attr:`least_taken`, the hosts taken so far)."""
        summed = size > 0
        hosts = needs.host_set - summing  # the loop's order
        host_in = self.host_in
        # each host's get(h, 0.0) + nbytes, in the set's order (one update, no loop)
        host_in.update(zip(hosts, map(operator.add, map(host_in.get, hosts,
                                                        itertools.repeat(0.0)),
                                      itertools.repeat(nbytes))))
        key = (needers, size, hold_hosts) if summed else needers
        taken = self.least_taken.get(key)
        if taken is None:
            taken = self.least_taken[key] = set()
        elif taken >= hosts:
            return
        per_host, host_least = needs.per_host, self.host_least
        for h in hosts:
            # an addend inside h may merge there without crossing its NICs
            adds = size if summed and h not in hold_hosts else 1
            spread = per_host[h]
            least = host_least.get(h, (adds, spread))
            host_least[h] = (min(least[0], adds), min(least[1], spread))
        taken.update(hosts)

    def _needs(self, needers: frozenset[int]) -> _Needs:
        """``needers``' hosts (found once per set)."""
        got = self.needs.get(needers)
        if got is None:
            host_of = self.host_of
            order = list(needers)  # the set's own order, as a loop over it goes
            hosts = [host_of(d) for d in order]
            per_host: dict[int, int] = {}  # needers per host
            by_host: dict[int, list[int]] = {}
            for d, h in zip(order, hosts):
                per_host[h] = per_host.get(h, 0) + 1
                by_host.setdefault(h, []).append(d)
            host_set = {host_of(d) for d in needers}
            got = self.needs[needers] = _Needs(order, hosts, host_set, frozenset(host_set),
                                               per_host, by_host)
        return got

    def _receive(self, needs: _Needs, nbytes: float, hold_hosts: frozenset[int]) -> None:
        """:meth:`_receive_each` of a plain cell no needer of which holds it, where no
        message is charged: its bytes join the run of cells of the same needer set
        before it (:meth:`settle` counts the run)."""
        if needs is not self.run_needs:
            self.settle()
            self.run_needs = needs
        self.run_bytes.append(nbytes)
        for h in hold_hosts.intersection(needs.by_host):
            self.near.update(needs.by_host[h])

    def settle(self) -> None:
        """Count the run of plain cells of one needer set (:meth:`_receive`) into
        ``dev_in`` and ``host_take``: the same sums, key by key in the same order, as
        adding each cell's bytes to each needer and, once per needer, to its host
        (:meth:`_receive_each`). A key's sum depends only on its value before the run
        and how many times each cell adds to it, so each such pair is summed once; new
        keys go in in the order the first cell would have put them in."""
        needs, run = self.run_needs, self.run_bytes
        if needs is None:
            return
        self.run_needs, self.run_bytes = None, []
        one = len(run) == 1  # one cell: each key once (a host: as often as its needers)
        if one:
            _add_once(self.dev_in, needs.order, run[0])
        else:
            _add_run(self.dev_in, needs.order, itertools.repeat(1), run)
        if one and len(needs.per_host) == len(needs.order):  # a needer a host
            _add_once(self.host_take, needs.per_host, run[0])
        else:
            _add_run(self.host_take, needs.per_host, needs.per_host.values(), run)

    def _receive_each(self, holders: frozenset[int], needers: frozenset[int], nbytes: float,
                      summed: bool, summing: set[int] | frozenset[int]) -> None:
        """Count what each needer of a cell receives (or copies, holding it)."""
        self.settle()
        host_of = self.host_of
        for d in needers:
            if d in holders and not summed:
                self.dev_copy[d] = self.dev_copy.get(d, 0.0) + nbytes
            else:
                self.dev_in[d] = self.dev_in.get(d, 0.0) + nbytes
                self.host_take[host_of(d)] = self.host_take.get(host_of(d), 0.0) + nbytes
                if summed:
                    self.sums_to.add(d)
                elif self.roots is not None:
                    self.roots.setdefault(d, set()).add(frozenset(holders))
                if host_of(d) in summing:
                    self.near.add(d)

    def fewest_messages(self) -> int:
        """Messages the devices must receive at the least, each device the more of:
        its bytes ``b`` in pieces of ``pipeline_piece(relay_piece, b)`` (no message of
        a send, a broadcast or an all-gather into it carries more: its pieces are of a
        transfer of at most ``b`` bytes, :func:`messages`; one for a device needing a
        sum, whose all-reduce's ring messages are of any size, or without a piece size);
        and its cells' holder sets that share no device (a message carries the boxes
        of one cell group, or of several with one root, which their holder sets share:
        a greedy pick of disjoint sets, the smallest first, counts some of them)."""
        roots = self.roots or {}
        total = 0
        for d, b in self.dev_in.items():
            least = 1 if d in self.sums_to else edge_pieces(int(b), self.cluster)
            taken: set[int] = set()
            disjoint = 0
            for hs in sorted(roots.get(d, ()), key=len):
                if taken.isdisjoint(hs):
                    taken |= hs
                    disjoint += 1
            total += max(least, disjoint)
        return total

    def bound(self) -> float:
        """The largest term. Each is bytes over a bandwidth plus the least latency its
        bytes may pay: bytes that must cross a host boundary one network latency,
        bytes a device may receive from its own host (or a host's merges) one
        intra-host latency."""
        self.settle()
        cluster = self.cluster
        lat, intra = cluster.latency, min(cluster.latency, cluster.intra_latency)
        terms = [0.0]
        terms += [lat + ingress_time(b / cluster.nic_bandwidth, *self.host_least[h], intra)
                  for h, b in self.host_in.items()]
        terms += [b / cluster.intra_bandwidth + (intra if d in self.near else lat)
                  for d, b in self.dev_in.items()]
        terms += [b / cluster.copy_bandwidth for b in self.dev_copy.values()]
        if cluster.shared_bandwidth and self.dev_in:
            terms.append((sum(self.dev_in.values()) + self.merged) / cluster.shared_bandwidth
                         + (2 * cluster.message_cost * self.fewest_messages()
                            if cluster.message_cost else 0.0) + intra)
        # A host takes its bytes in through its devices' links, or sends a sum's addends
        # out through its NICs to be merged elsewhere.
        for h, b in self.host_take.items():
            terms.append(b / (len(cluster.hosts[h]) * cluster.intra_bandwidth
                              + cluster.nic_bandwidth) + intra)
        # Slices held only inside a host set S and needed outside it leave through S's
        # NICs.
        for s in self.leave:
            out = sum(nb for hs, items in self.leave.items() if hs <= s
                      for need, nb in items if not need <= s)
            terms.append(out / (len(s) * cluster.nic_bandwidth) + lat)
        terms += self._conversions()
        return max(terms)

    def _conversions(self) -> list[float]:
        """Seconds of converting: the source bytes of a cast held only by a device set
        are converted by its devices, each at ``cast_bandwidth`` (a device converts what
        it sends before its step's transfers go, so the plan lasts at least its own
        conversions): per set of holders (with the bytes of its subsets, up to
        :data:`_SUBSET_SETS` sets), and all of them over every holder."""
        if not self.convert:
            return []
        rate = self.cluster.cast_bandwidth
        sets = list(self.convert.items())
        if len(sets) <= _SUBSET_SETS:
            terms = [sum(b for hs, b in sets if hs <= s) / (len(s) * rate) for s, _ in sets]
        else:
            terms = [b / (len(s) * rate) for s, b in sets]
        holders = frozenset().union(*self.convert)
        terms.append(sum(self.convert.values()) / (len(holders) * rate))
        return terms


def _add_once(sums: dict[int, float], keys: Iterable[int], b: float) -> None:
    """:func:`_add_run` of one value once per key: each of ``keys``' sums (a missing
    one from 0.0) plus ``b``, all read before any is written, in the keys' order."""
    totals = list(map(operator.add, map(sums.get, keys, itertools.repeat(0.0)),
                      itertools.repeat(b)))
    sums.update(zip(keys, totals))


def _add_run(sums: dict[int, float], keys: Iterable[int], times: Iterable[int],
             run: list[float]) -> None:
    """Add each of ``run``'s values in turn, ``times`` times over (per key), to each of
    ``keys``' sums in ``sums`` (a missing one from 0.0), as a loop over the keys per
    value would: a (start, times) pair's result is found once."""
    done: dict[tuple[float, int], float] = {}
    get = sums.get
    out = []
    for k, n in zip(keys, times):
        start = get(k, 0.0)
        total = done.get((start, n))
        if total is None:
            total = start
            for b in run:
                for _ in range(n):
                    total += b
            done[start, n] = total
        out.append((k, total))
    sums.update(out)


__all__ = ["ingress_time", "lower_bound"]

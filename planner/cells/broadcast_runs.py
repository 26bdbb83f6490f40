"""A run of broadcasts, each from one holder to receivers all on one other host, planned
together: the receivers' entries chosen round by round with arrays.

:func:`~reshard.planner.cells.cell_tasks.plan_broadcast` of such a cell (every cell of
a partial sum's reduced pieces sent to a destination host: 131,072 of them at 1,024
devices) reads :meth:`Loads.relay_chain`'s quick chain: the receiver with the least
(NIC in load, id) enters, the rest follow in id order; where neither end of the host
boundary may relay (:meth:`Loads.may_relay_end`), :meth:`Loads.charge` adds the bytes
to the root's send load and its NIC's out load, to every receiver's receive load and
to the entry's NIC in load. A cell's choice reads only its receivers' NIC in loads,
which only the cells to the same receivers change; so where the run's receiver sets
share no NIC, the k-th cells of all the sets are chosen at once (round k), each NIC
and device getting the same additions in the same order as cell by cell: the same
floats, the same chains."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reshard.planner.cells.balance import ARRAY_CHAIN, Loads
from reshard.planner.cells.decompose import Cell
from reshard.planner.cells.new_tasks import broadcast_runs_tasks
from reshard.planner.cells.send_runs import is_send, plan_sends
from reshard.planner.cells.set_codes import first_order
from reshard.planner.cells.whole_sums import EXACT, stays_whole
from reshard.planner.values.resources import NIC_IN, NIC_OUT
from reshard.planner.values.tasks import Task

CellRun = Sequence[tuple[Cell, int, int, int]]
"""Cells planned one after another: (cell, tensor, itemsize, step) each."""

Group = tuple[int, tuple[tuple[int, int], ...]]
"""Receivers on one host: the host and their (device, NIC) pairs in id order."""

MIN_RUN = 512
"""Cells from which a run is planned round by round (fewer: cell by cell is quicker)."""


def one_host(loads: Loads, receivers: frozenset[int]) -> Group | None:
    """``receivers``' :data:`Group`, where they are two or more, fewer than
    :data:`~reshard.planner.cells.balance.ARRAY_CHAIN`, on one host of a cluster with
    several NICs per host (:meth:`Loads.relay_chain` then answers their quick chain);
    else None. Found once per receiver set (it reads only the cluster)."""
    memo = loads._needers.one_host
    if receivers in memo:
        return memo[receivers]
    got = None
    if 1 < len(receivers) < ARRAY_CHAIN and loads.cluster.nics_per_host > 1:
        hosts = set(map(loads.host, receivers))
        if len(hosts) == 1:
            got = hosts.pop(), tuple((d, loads.nic(d)) for d in sorted(receivers))
    memo[receivers] = got
    return got


def plan_run(run: CellRun, loads: Loads) -> list[list[Task]] | None:
    """Each cell's tasks (one broadcast) where every cell of ``run`` (at least
    :data:`MIN_RUN`) has one holder and needers all on one other host (its
    receivers, :func:`one_host`), the receiver sets share no NIC, and no root's NIC out
    and no chosen entry's NIC in may relay (asked as cell by cell asks them, up to the
    first that may); else None, having changed no load."""
    if len(run) < MIN_RUN:
        return None
    if is_send(run[0][0]):  # point to point: never a broadcast run (_groups declines)
        return plan_sends(run, loads)
    found = _groups(run, loads)
    if found is None:
        return None
    chains = plan_groups(found, loads)
    if chains is None:
        return None
    return broadcast_runs_tasks(run, found[2], chains, found[3])


def plan_groups(found: Found, loads: Loads) -> list[tuple[int, ...]] | None:
    """Each cell's chain (its entry, then the rest of its group in id order) for a
    run's groups, roots and bytes (:func:`_groups`, or read from a table's rows), the
    cells chosen round by round and charged as :func:`plan_run` says; None where a load
    is NaN or a chosen entry's NIC in may relay, having changed no load."""
    groups, group_of, roots, nbytes = found
    group_arr = np.array(group_of, dtype=np.int64)
    rounds = _rounds(loads, groups, group_arr, nbytes)
    if rounds is None:
        return None
    entry, nic_load, dev_load = rounds
    width = nic_load.shape[1]
    _, first = np.unique(group_arr * width + entry, return_index=True)
    for c in np.sort(first).tolist():  # each group's entries, in the order first chosen
        if loads.may_relay_end(NIC_IN, groups[group_of[c]][1][entry[c]][0]):
            return None
    _, starts = np.unique(group_arr, return_index=True)  # each group's first cell
    _charge(loads, groups, entry[starts].tolist(), nic_load, dev_load, roots, nbytes)
    return _chains(groups, group_arr, entry, width)


def _chains(groups: list[Group], group_of: np.ndarray, entry: np.ndarray, width: int
            ) -> list[tuple[int, ...]]:
    """Each cell's chain: its entry, then the rest of its group's receivers in id order
    (one tuple per distinct (group, entry), shared by its cells)."""
    keys, inverse = np.unique(group_of * width + entry, return_inverse=True)
    made = []
    for g, e in zip((keys // width).tolist(), (keys % width).tolist()):
        devs = [d for d, _ in groups[g][1]]
        made.append((devs[e], *devs[:e], *devs[e + 1:]))
    return [made[k] for k in inverse.reshape(-1).tolist()]


Found = tuple[list[Group], list[int], list[int], list[int]]
"""A run's groups, each cell's group, root and bytes (:func:`_groups`)."""


def _groups(run: CellRun, loads: Loads) -> Found | None:
    """The run's receiver groups, each cell's group, root and bytes; None where
    :func:`plan_run` does not apply (asking whether each root's NIC out may relay, in
    the cells' order, up to the first that may)."""
    host, may = loads.host, loads.may_relay_end
    index: dict[frozenset[int], int] = {}
    groups: list[Group] = []
    group_of: list[int] = []
    roots: list[int] = []
    nbytes: list[int] = []
    root_host: dict[int, int] = {}  # a root asked already (its NIC out may not relay)
    for cell, _, itemsize, _ in run:
        holders, needers = cell.holders, cell.needers
        if len(holders) != 1:
            return None
        g = index.get(needers)
        if g is None:
            got = one_host(loads, needers)
            if got is None:
                return None
            g = index[needers] = len(groups)
            groups.append(got)
        (root,) = holders
        h = root_host.get(root)
        if h is None:  # first seen: asked as cell by cell asks (later asks read a cache)
            h = host(root)
            if h == groups[g][0] or may(NIC_OUT, root):
                return None
            root_host[root] = h
        elif h == groups[g][0]:
            return None
        group_of.append(g)
        roots.append(root)
        nbytes.append(cell.size * itemsize)
    nics = [n for _, pairs in groups for _, n in pairs]
    if len(set(nics)) != len(nics):
        return None
    return groups, group_of, roots, nbytes


def _rounds(loads: Loads, groups: list[Group], group_of: np.ndarray, nbytes: list[int]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each cell's entry (its position in its group) chosen round by round, and the
    receivers' NIC in and device receive loads after the run (rows: groups; columns:
    receivers), none of them charged yet: round k takes the k-th cell of every group
    at once (the groups share no NIC and no device). None where a load is NaN."""
    nic_in, dev_in = loads.nic_in, loads.dev_in
    width = max(len(pairs) for _, pairs in groups)
    nic_load = np.full((len(groups), width), np.inf)
    dev_load = np.zeros((len(groups), width))
    for g, (_, pairs) in enumerate(groups):
        nic_load[g, :len(pairs)] = [nic_in[n] for _, n in pairs]
        dev_load[g, :len(pairs)] = [dev_in.get(d, 0.0) for d, _ in pairs]
    if np.isnan(nic_load).any():
        return None
    counts = np.bincount(group_of, minlength=len(groups))
    by_group = np.argsort(group_of, kind="stable")  # each group's cells in run order
    rank = np.empty(len(group_of), dtype=np.int64)
    rank[by_group] = np.arange(len(group_of)) - np.repeat(np.cumsum(counts) - counts, counts)
    by_round = np.argsort(rank, kind="stable")
    amount = np.array(nbytes, dtype=np.float64)
    entry = np.empty(len(group_of), dtype=np.int64)
    lo = 0
    for hi in np.cumsum(np.bincount(rank)).tolist():
        cells = by_round[lo:hi]
        rows = group_of[cells]
        col = nic_load[rows].argmin(axis=1)  # the first least: the least id among ties
        nic_load[rows, col] += amount[cells]
        dev_load[rows] += amount[cells, None]
        entry[cells] = col
        lo = hi
    return entry, nic_load, dev_load


def _charge(loads: Loads, groups: list[Group], first: list[int], nic_load: np.ndarray,
            dev_load: np.ndarray, roots: list[int], nbytes: list[int]) -> None:
    """:meth:`Loads.charge` of every cell of the run: the receivers' loads as
    :func:`_rounds` added them (a receive load first written, as cell by cell, in the
    order of its group's first chain: ``first``, each group's first entry), the roots'
    one by one in the cells' order."""
    nic_in, dev_in = loads.nic_in, loads.dev_in
    for g, (_, pairs) in enumerate(groups):
        for (_, n), a in zip(pairs, nic_load[g].tolist()):
            nic_in[n] = a
        e = first[g]
        received = dev_load[g].tolist()
        for i in (e, *range(e), *range(e + 1, len(pairs))):
            dev_in[pairs[i][0]] = received[i]
    if not _charge_roots(loads, roots, nbytes):
        dev_out, nic_out, nic = loads.dev_out, loads.nic_out, loads.nic
        for root, nb in zip(roots, nbytes):
            dev_out[root] += nb
            nic_out[nic(root)] += nb


def _charge_roots(loads: Loads, roots: list[int], nbytes: list[int]) -> bool:
    """The roots' send loads and their NICs' out loads charged each by one sum, where
    every load they add to is a whole number and stays below :data:`EXACT` (the cells'
    whole-byte additions one by one are then exact: the same floats in any order); the
    loads' new keys in the order first charged, as cell by cell. Else False, having
    changed nothing."""
    nb = np.array(nbytes)
    if nb.dtype != np.int64 or not len(nb) or int(nb.min()) < 0 or \
            int(nb.max()) * len(nb) >= EXACT:
        return False
    root, first = first_order(np.array(roots, dtype=np.int64))
    by_root = np.zeros(len(first), dtype=np.int64)
    np.add.at(by_root, root, nb)
    by_dev = dict(zip(np.array(roots, dtype=np.int64)[first].tolist(), by_root.tolist()))
    nic = loads.nic
    by_nic: dict[int, int] = {}  # the NICs in the order first charged
    for r, total in by_dev.items():
        n = nic(r)
        by_nic[n] = by_nic.get(n, 0) + total
    sums = [(loads.dev_out, by_dev), (loads.nic_out, by_nic)]
    if not all(stays_whole(table, adds.keys(), adds.values()) for table, adds in sums):
        return False
    for table, adds in sums:
        for key, total in adds.items():
            table[key] += total
    return True


__all__ = ["MIN_RUN", "Found", "one_host", "plan_groups", "plan_run"]

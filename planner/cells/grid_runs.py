"""A run of long broadcasts, each from one root to the same receivers laid out as whole
rows of other hosts, planned on (host, member) arrays: the receivers' NIC loads kept as
two tables of rows, each chain found by a few row-wise operations, its charges added
to the rows, the loads' tables written once at the end.

:func:`~reshard.planner.cells.cell_tasks.plan_broadcast` of such a cell (every cell of
an ``S10R`` source sent to an ``RR`` destination at 1,024 devices: 1,024 roots to the
same 1,024 receivers on 128 hosts) asks :meth:`Loads.relay_chain`, which answers
:func:`~reshard.planner.cells.chain_arrays.unrelayed_chain` where no host boundary may
relay, and :meth:`Loads.charge` of that chain. With every receiver host's receivers a
row of ``k`` (two or more, ids rising; the hosts rising row by row), a NIC each, none
the root's host or NIC, that chain (:func:`_order`'s sort) is: the hosts by their
least NIC out load, then host; inside a host its entry (least NIC in load, then id)
first, then in every host but the last the rest by most NIC out load, then id, but the
one with the least (NIC out load, id) moved to the end; in the last host the rest by
id. Its charges add the bytes to the root's send load and its NIC's out load, to
every receiver's receive load, to each host's entry's NIC in load and to each host's
last member's NIC out load but the last host's (one addition per NIC: a NIC each).

Exact: the same comparisons (no load is NaN or infinite: checked once, and whole
byte additions keep them finite), the same questions asked of
:meth:`Loads.may_relay_end` in the same order (:func:`unrelayed_chain`'s: the root and
each host's last member before the move, then each entry), the same additions to each
load in the same order (each row value is its table's, read once and kept in step),
the tables' new keys added in the order the cells would add them (while a receiver's
key is missing, each cell writes its touched keys as it goes). A cell whose question
says a boundary may relay ends the run's prefix: the caller plans it and the rest."""

from __future__ import annotations

import itertools

import numpy as np

from reshard.planner.cells.balance import ARRAY_CHAIN, Loads
from reshard.planner.cells.broadcast_runs import CellRun
from reshard.planner.cells.chain_arrays import may_relay_any, refused
from reshard.planner.cells.new_tasks import broadcast_runs_tasks
from reshard.planner.cells.whole_sums import EXACT
from reshard.planner.values.resources import NIC_IN, NIC_OUT
from reshard.planner.values.tasks import Task


class Grid:
    """A receiver set's layout as rows (one a host, hosts rising; ids rising along a
    row): the devices, their NICs and the set's hosts, and its loads as rows, kept in
    step with the cells' charges (``sent``: NIC out, ``got``: NIC in, ``received``:
    device receive loads). ``base``: each row's first place in the rows read flat
    (each cell's places are read and charged flat: one index a place)."""

    __slots__ = ("base", "checked", "dev", "flat", "got", "have_in", "have_out", "hosts",
                 "ids", "nic_list", "nic_set", "nics", "received", "refused", "rows",
                 "sent", "width")

    def __init__(self, loads: Loads, dev: np.ndarray, hosts: frozenset[int]) -> None:
        self.dev = dev
        self.rows, self.width = dev.shape
        self.flat = dev.reshape(-1)
        # the devices as Python ints, made once: each chain's tuple takes these (a
        # thousand chains of a thousand devices: no new int objects each)
        self.ids = self.flat.astype(object)
        self.base = np.arange(self.rows, dtype=np.int64) * self.width
        self.hosts = hosts
        self.nic_list = list(map(loads.nic, self.flat.tolist()))
        self.nic_set = frozenset(self.nic_list)
        self.nics = np.array(self.nic_list, dtype=np.int64)
        zero = itertools.repeat(0.0)  # an unseen key reads 0.0 (and is not added)
        n = len(self.nic_list)
        self.sent = np.fromiter(map(loads.nic_out.get, self.nic_list, zero), dtype=np.float64,
                                count=n).reshape(dev.shape)
        self.got = np.fromiter(map(loads.nic_in.get, self.nic_list, zero), dtype=np.float64,
                               count=n).reshape(dev.shape)
        self.have_out = np.fromiter(map(loads.nic_out.__contains__, self.nic_list),
                                    dtype=bool, count=n)
        self.have_in = np.fromiter(map(loads.nic_in.__contains__, self.nic_list),
                                   dtype=bool, count=n)
        self.received: np.ndarray | None = None  # read once every receiver has a key
        self.refused = False  # every receiver asked both ways, and may not relay
        self.checked = False  # refused asked since a receiver was last asked


def grid_of(loads: Loads, receivers: frozenset[int]) -> Grid | None:
    """``receivers``' :class:`Grid` where they are at least
    :data:`~reshard.planner.cells.balance.ARRAY_CHAIN`, on a cluster with several NICs
    per host, each with a NIC of its own, whole rows of two or more per host; else
    None. Its loads must be finite (no NaN, no infinity)."""
    if len(receivers) < ARRAY_CHAIN or loads.cluster.nics_per_host < 2:
        return None
    devs = sorted(receivers)
    hosts = np.fromiter(map(loads.host, devs), dtype=np.int64, count=len(devs))
    distinct = np.unique(hosts)
    width = len(devs) // len(distinct)
    if width < 2 or width * len(distinct) != len(devs):
        return None
    by_row = hosts.reshape(-1, width)
    if not (by_row == by_row[:, :1]).all() or not (np.diff(by_row[:, 0]) > 0).all():
        return None
    grid = Grid(loads, np.array(devs, dtype=np.int64).reshape(-1, width),
                frozenset(distinct.tolist()))
    if len(grid.nic_set) != len(devs) or not np.isfinite(grid.sent).all() or \
            not np.isfinite(grid.got).all():
        return None
    return grid


Chain = tuple[tuple[int, ...], np.ndarray, np.ndarray]
"""A cell's chain, each row's member that leaves (every row but the last in chain
order) and the rows' members in chain order, a row a host, its entry first (places in
the rows read flat)."""


def grid_chain(grid: Grid) -> Chain:
    """The chain of a root on another host to the grid's receivers as its loads stand
    (the module docstring's order: :func:`unrelayed_chain`'s where nothing relays)."""
    sent, base = grid.sent, grid.base
    order = sent.min(axis=1).argsort(kind="stable")  # by least NIC out, then host
    entry = base + grid.got.argmin(axis=1)  # the first least: the least id among ties
    idle = sent.copy()
    flat = idle.reshape(-1)
    flat[entry] = np.inf  # (every load finite: the entry is never the least)
    last = base + idle.argmin(axis=1)  # the least (NIC out, id) but the entry's: moved last
    key = np.negative(idle)  # most NIC out load first (a stable sort: then id), entry first
    key.reshape(-1)[last] = np.inf
    final = order[-1]  # the last host: its entry, then by id
    key[final] = 0.0
    key[final, entry[final] - base[final]] = -np.inf
    at = key.argsort(axis=1, kind="stable")[order]
    at += base[order][:, None]  # flat places, row by row in chain order
    chain = tuple(grid.ids.take(at.reshape(-1)).tolist())
    return chain, last[order[:-1]], at


def _questions(loads: Loads, grid: Grid, root: int, got: Chain) -> bool:
    """:func:`unrelayed_chain`'s questions of a chain, asked as it asks them: whether
    the root or a host's last member before the move (the member before it where
    their NIC out loads tie: the walk would have asked it) may relay out, then whether
    an entry may relay in; True where one may. Once every receiver said no both ways
    (``grid.refused``; asked again only where a receiver was asked since), only the
    root's answer is open."""
    asked = loads._may_relay
    if grid.refused:
        known = asked.get((NIC_OUT, root))
        return loads.may_relay_end(NIC_OUT, root) if known is None else known
    _, leaving, at = got
    if grid.width > 2:  # (two a host: nothing moved)
        sent = grid.sent.reshape(-1)
        before = at[:-1, -2]
        leaving = np.where(sent[before] == sent[leaving], before, leaving)
    count = len(asked) + ((NIC_OUT, root) not in asked)  # with the root's own answer
    out = np.concatenate((np.array([root], dtype=np.int64), grid.flat.take(leaving)))
    if may_relay_any(loads, NIC_OUT, out) or \
            may_relay_any(loads, NIC_IN, grid.flat.take(at[:, 0])):
        return True
    if not grid.checked or len(asked) != count:  # a receiver asked: refused again
        grid.refused = refused(loads, grid.flat)
        grid.checked = True
    return False



def _charge(loads: Loads, grid: Grid, root: int, got: Chain, nbytes: int) -> None:
    """:meth:`Loads.charge` of ``got``'s chain from ``root``: the root's loads in the
    tables, the receivers' in the rows (and, while a table lacks a receiver's key, the
    keys it touches written as they are added, in the order the charge adds them)."""
    chain, leaving, at = got
    loads.dev_out[root] += nbytes
    if grid.received is None:  # a receiver's first charge adds its key, in chain order
        dev_in = loads.dev_in
        for r in chain:
            dev_in[r] += nbytes
        grid.received = np.fromiter(map(dev_in.__getitem__, grid.flat.tolist()),
                                    dtype=np.float64, count=len(chain))
    else:
        grid.received += nbytes
    loads.nic_out[loads.nic(root)] += nbytes
    entry = at[:, 0]
    sent, got_in = grid.sent.reshape(-1), grid.got.reshape(-1)
    sent[leaving] += nbytes  # (one place a row: each added once)
    got_in[entry] += nbytes
    for table, have, values, places in ((loads.nic_out, grid.have_out, sent, leaving),
                                        (loads.nic_in, grid.have_in, got_in, entry)):
        if not have.all():  # new keys: in crossing order, as the charge adds them
            table.update(zip(grid.nics[places].tolist(), values[places].tolist()))
            have[places] = True


def _flush(loads: Loads, grid: Grid) -> None:
    """Write the rows' loads to the tables (every receiver's key there already: those
    a table still lacked were written as they were charged)."""
    for table, have, values in ((loads.nic_out, grid.have_out, grid.sent),
                                (loads.nic_in, grid.have_in, grid.got)):
        if have.all():
            table.update(zip(grid.nic_list, values.reshape(-1).tolist()))
    if grid.received is not None:
        loads.dev_in.update(zip(grid.flat.tolist(), grid.received.tolist()))


MIN_GRID = 8
"""Cells from which a run is tried as a grid's (fewer: the layout costs more than it
saves)."""


def plan_grid_run(run: CellRun, loads: Loads) -> list[list[Task]]:
    """The tasks of ``run``'s longest prefix of cells (none where ``run`` is shorter
    than :data:`MIN_GRID`) each from one root, on another host than every receiver's
    and with a NIC none of them has, to the first cell's needers laid out as a
    :class:`Grid`, of a whole number of bytes below
    :data:`~reshard.planner.cells.whole_sums.EXACT`, whose chain's questions say no
    boundary may relay and whose root's chain :class:`~reshard.planner.
    cells.chain_memo.ChainMemo` would not look up by the loads (noted there as the cell
    would note it); each one broadcast, as
    :func:`~reshard.planner.cells.cell_tasks.plan_broadcast` plans it, with the same
    charges to ``loads``."""
    if len(run) < MIN_GRID or len(run[0][0].holders) != 1:
        return []
    needers = run[0][0].needers
    grid = grid_of(loads, needers)
    if grid is None:
        return []
    host, nic, memo = loads.host, loads.nic, loads._chains
    roots: list[int] = []
    chains: list[tuple[int, ...]] = []
    nbytes: list[int] = []
    for cell, _, itemsize, _ in run:
        nb = cell.size * itemsize
        if len(cell.holders) != 1 or (cell.needers is not needers and cell.needers != needers) \
                or type(nb) is not int or not 0 <= nb < EXACT:
            break
        (root,) = cell.holders
        if host(root) in grid.hosts or nic(root) in grid.nic_set:
            break
        got = grid_chain(grid)
        if _questions(loads, grid, root, got) or memo.reads(loads, root, needers):
            break  # (a root asked again, its answer looked up by loads the rows hold)
        _charge(loads, grid, root, got, nb)
        roots.append(root)
        chains.append(got[0])
        nbytes.append(nb)
    _flush(loads, grid)
    if chains:  # the last chain's crossings, as its cell left them noted
        loads.crossings = (chains[-1], host(roots[-1]),
                           list(range(0, len(chains[-1]), grid.width)))
    return broadcast_runs_tasks(run, roots, chains, nbytes)


__all__ = ["MIN_GRID", "Grid", "grid_chain", "grid_of", "plan_grid_run"]

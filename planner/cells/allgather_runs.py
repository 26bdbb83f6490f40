"""A run of all-gather cells with nothing to choose, planned in bulk (issue 62).

:func:`~reshard.planner.cells.cell_tasks.plan_allgathers` plans each cell in turn. Where
every cell of the run has one holder and every host of its needers holds none of it
(two or more needers there, none a holder: no copies, no local broadcast), a cell's
tasks read nothing of the loads: the only holder sends each needer its piece of the
box (:func:`~reshard.planner.cells.cell_tasks.split_box`), and the needers all-gather
it at the step after. Its charges are then the same for every cell of the same
holders, needers, box extents and item size (one *template*), so the run's charges
are one sum per key, added once. A template's receipts read no root (each needer's
pieces and shares, onto its device and NIC): they are found once per (needers, box
extents, item size) and shared by the templates of every root, which add only the
bytes the root sends out (:class:`_Receipts`; 4x8 partial sums: 32-76 templates a
run, a few needer sets).

Exact: the tasks are built from the same pieces in the same order. The charges are
whole, non-negative numbers (each template's piece bytes, and its share, checked
whole), so where every key's start and final total are whole and below 2**53
(:func:`~reshard.planner.cells.whole_sums.stays_whole`) each addition on the way is
exact, in any order, and one addition of the total gives the same float. Each key is
written in the order the cells first touch it (a template's cells after its first
touch none anew), so the tables' key order is the same too. Where any condition
fails :func:`plan_run` answers None, having written nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from reshard.layout import Box, chunk_size
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.broadcast_runs import CellRun
from reshard.planner.cells.decompose import Cell
from reshard.planner.cells.new_tasks import SETTERS, new_task
from reshard.planner.cells.whole_sums import stays_whole
from reshard.planner.values.tasks import Buffer, Task, TaskKind

_Group = tuple[tuple[int, ...], int, tuple[tuple[int, int], ...], tuple[int, ...]]
"""One needer host of a template: its needers (id order), the dim its pieces cut, each
piece's bounds along that dim relative to the box's start, and each piece's bytes."""

_Charges = tuple[dict[int, int], dict[int, int], dict[int, int], dict[int, int]]
"""One cell's additions, summed per key in first-touch order: dev_out, dev_in, nic_out,
nic_in."""


class _Template:
    """What every cell of one (holders, needers, extents, item size) plans alike."""

    __slots__ = ("charges", "groups", "nbytes", "root")

    def __init__(self, root: int, nbytes: int, groups: list[_Group], charges: _Charges):
        self.root, self.nbytes, self.groups, self.charges = root, nbytes, groups, charges


DimOf = Callable[[Box, int], int]
"""The dim ``split_box`` cuts a box into ``k`` pieces along by default
(:func:`~reshard.planner.cells.cell_tasks.split_dim`, which reads the extents alone)."""


def _split(extents: tuple[int, ...], k: int, itemsize: int, dim_of: DimOf
           ) -> tuple[int, tuple[tuple[int, int], ...], tuple[int, ...]]:
    """``split_box`` of a box of ``extents`` into ``k``: the dim, each piece's bounds
    along it from the box's start, and each piece's bytes (they read only extents)."""
    d = dim_of(tuple((0, n) for n in extents), k)
    n = extents[d]
    c = chunk_size(n, k)
    bounds = tuple((min(i * c, n), min(i * c + c, n)) for i in range(k))
    rest = 1
    for i, e in enumerate(extents):
        if i != d:
            rest *= e
    return d, bounds, tuple((b - a) * rest * itemsize for a, b in bounds)


_Hosts = tuple[frozenset[int], tuple[tuple[int, ...], ...]]
"""A needer set's hosts, and each host's needers (id order) in host order."""


class _Receipts:
    """What every template of one (needers, extents, item size) shares, whatever its
    root: the groups, and the charges that read no root (``dev_in``, ``nic_in``, and
    the bytes the root sends out: its ``dev_out``, and its NIC's ``nic_out`` where every
    needer host is another host, as the template requires)."""

    __slots__ = ("dev_in", "groups", "hosts", "nic_in", "sent")

    def __init__(self, hosts: frozenset[int], groups: list[_Group], dev_in: dict[int, int],
                 nic_in: dict[int, int], sent: int):
        self.hosts, self.groups, self.dev_in, self.nic_in, self.sent = \
            hosts, groups, dev_in, nic_in, sent


class _Memo:
    """What a run's templates share: each needer set's :data:`_Hosts`, each split's
    (dim, bounds, bytes) by (extents, pieces, item size), each (needers, extents,
    item size)'s :class:`_Receipts` (None: no template has them)."""

    __slots__ = ("hosts", "receipts", "splits")

    def __init__(self) -> None:
        self.hosts: dict[frozenset[int], _Hosts] = {}
        self.splits: dict[tuple[tuple[int, ...], int, int],
                          tuple[int, tuple[tuple[int, int], ...], tuple[int, ...]]] = {}
        self.receipts: dict[tuple[frozenset[int], tuple[int, ...], int],
                            _Receipts | None] = {}

    def hosts_of(self, needers: frozenset[int], host: Callable[[int], int]) -> _Hosts:
        got = self.hosts.get(needers)
        if got is None:
            by_host: dict[int, list[int]] = {}
            for n in sorted(needers):
                by_host.setdefault(host(n), []).append(n)
            got = self.hosts[needers] = (frozenset(by_host), tuple(
                tuple(members) for _, members in sorted(by_host.items())))
        return got

    def split(self, extents: tuple[int, ...], k: int, itemsize: int, dim_of: DimOf
              ) -> tuple[int, tuple[tuple[int, int], ...], tuple[int, ...]]:
        key = (extents, k, itemsize)
        got = self.splits.get(key)
        if got is None:
            got = self.splits[key] = _split(extents, k, itemsize, dim_of)
        return got


def _receipts(needers: frozenset[int], extents: tuple[int, ...], itemsize: int,
              nbytes: int, host: Callable[[int], int], nic: Callable[[int], int],
              dim_of: DimOf, memo: _Memo) -> _Receipts | None:
    """The :class:`_Receipts` of ``needers`` and a box of ``extents`` (``nbytes``),
    found once per run; None where a lone needer is on a host or a share is
    fractional (no template then, whatever the root)."""
    key = (needers, extents, itemsize)
    if key in memo.receipts:
        return memo.receipts[key]
    got = memo.receipts[key] = _find_receipts(needers, extents, itemsize, nbytes, host,
                                              nic, dim_of, memo)
    return got


def _find_receipts(needers: frozenset[int], extents: tuple[int, ...], itemsize: int,
                   nbytes: int, host: Callable[[int], int], nic: Callable[[int], int],
                   dim_of: DimOf, memo: _Memo) -> _Receipts | None:
    """:func:`_receipts`, found: the template's loop over the needer hosts, less the
    root's additions (each piece's bytes onto its ``dev_out`` and NIC's ``nic_out``,
    summed here as ``sent``: whole numbers, the same totals in any order)."""
    hosts, by_host = memo.hosts_of(needers, host)
    if any(len(m) < 2 for m in by_host):
        return None
    dev_in: dict[int, int] = {}
    nic_in: dict[int, int] = {}
    sent = 0
    groups: list[_Group] = []
    for members in by_host:
        k = len(members)
        share = nbytes * (k - 1) / k
        if not share.is_integer():
            return None
        d, bounds, sizes = memo.split(extents, k, itemsize, dim_of)
        groups.append((members, d, bounds, sizes))
        for m, pb in zip(members, sizes):
            if pb:
                sent += pb
                dev_in[m] = dev_in.get(m, 0) + pb
                nic_in[nic(m)] = nic_in.get(nic(m), 0) + pb
        for m in members:
            dev_in[m] = dev_in.get(m, 0) + int(share)
    return _Receipts(hosts, groups, dev_in, nic_in, sent)


def _template(cell: Cell, extents: tuple[int, ...], itemsize: int,
              host: Callable[[int], int], nic: Callable[[int], int], dim_of: DimOf,
              memo: _Memo) -> _Template | None:
    """The cell's template, or None where it has a choice (or a copy, a local
    broadcast, a lone needer on a host, an empty box, a fractional share). Its
    receipts are its needers' and extents' (:func:`_receipts`, shared by every root);
    the root adds ``sent`` to its device's ``dev_out`` and its NIC's ``nic_out`` (no
    key where nothing is sent: every piece empty), each the one key of its table."""
    holders = cell.holders
    if len(holders) != 1 or not extents:
        return None
    (root,) = holders
    nbytes = itemsize
    for e in extents:
        nbytes *= e
    got = _receipts(cell.needers, extents, itemsize, nbytes, host, nic, dim_of, memo)
    if got is None or host(root) in got.hosts:
        return None  # (a needer that holds the cell, a copy, is on the root's host)
    sent = got.sent
    dev_out = {root: sent} if sent else {}
    nic_out = {nic(root): sent} if sent else {}
    return _Template(root, nbytes, got.groups, (dev_out, got.dev_in, nic_out, got.nic_in))


def _sends(tensor: int, pieces: tuple[Box, ...], root: int, members: tuple[int, ...],
           sizes: tuple[int, ...], step: int, out: list[Task]) -> None:
    """``new_task(SEND, tensor, piece, root, (m,), pb, step)`` of each nonempty piece
    appended to ``out``: the same slots set in the same order, no call per task."""
    (kind, tens, box, rt, recv, nb, st, source, pcs, through, parents, addends,
     addend_parents) = SETTERS
    send, src, new, append = TaskKind.SEND, Buffer.SRC, object.__new__, out.append
    for m, piece, pb in zip(members, pieces, sizes):
        if pb:
            t = new(Task)
            kind(t, send)
            tens(t, tensor)
            box(t, piece)
            rt(t, root)
            recv(t, (m,))
            nb(t, pb)
            st(t, step)
            source(t, src)
            pcs(t, ())
            through(t, ())
            parents(t, ())
            addends(t, ())
            addend_parents(t, ())
            append(t)


def _tasks(cell: Cell, tensor: int, step: int, t: _Template) -> list[Task]:
    """The cell's tasks as :func:`~reshard.planner.cells.cell_tasks.plan_allgather`
    builds them: each group's sends of nonempty pieces, then its all-gather."""
    box = cell.box
    root = t.root
    out: list[Task] = []
    last: tuple[tuple[int, int], ...] | None = None  # the bounds cut last, and its pieces
    pieces: tuple[Box, ...] = ()
    for members, d, bounds, sizes in t.groups:
        if bounds is not last:  # (hosts of as many needers share one split: one dim)
            head, tail = box[:d], box[d + 1:]
            lo = box[d][0]
            pieces = tuple([(*head, (lo + a, lo + b), *tail) for a, b in bounds])
            last = bounds
        _sends(tensor, pieces, root, members, sizes, step, out)
        out.append(new_task(TaskKind.ALLGATHER, tensor, box, -1, members, t.nbytes,
                            step + 1, source=Buffer.DST, pieces=pieces))
    return out


def plan_run(run: CellRun, loads: Loads, dim_of: DimOf) -> list[list[Task]] | None:
    """Every cell's tasks and the run's charges as ``plan_allgather`` of each cell in
    turn gives them (``dim_of``: its ``split_dim``), where every cell has a template and
    every total stays whole (module docstring); else None, nothing written."""
    host, nic = loads.host, loads.nic
    memo = _Memo()
    templates: dict[tuple[frozenset[int], frozenset[int], tuple[int, ...], int],
                    _Template] = {}
    counts: dict[int, int] = {}  # each template's cells, by id, in first-use order
    used: list[_Template] = []
    plans: list[_Template] = []
    for cell, _, itemsize, _ in run:
        extents = tuple(b - a for a, b in cell.box)
        key = (cell.holders, cell.needers, extents, itemsize)
        t = templates.get(key)
        if t is None:
            got = _template(cell, extents, itemsize, host, nic, dim_of, memo)
            if got is None:
                return None
            t = templates[key] = got
            counts[id(t)] = 0
            used.append(t)
        counts[id(t)] += 1
        plans.append(t)
    tables = (loads.dev_out, loads.dev_in, loads.nic_out, loads.nic_in)
    totals: list[dict[int, int]] = [{}, {}, {}, {}]
    for t in used:
        times = counts[id(t)]
        for total, charges in zip(totals, t.charges):
            for k, amount in charges.items():
                total[k] = total.get(k, 0) + amount * times
    if not all(stays_whole(table, total, total.values())
               for table, total in zip(tables, totals)):
        return None
    for table, total in zip(tables, totals):
        for k, amount in total.items():
            table[k] += amount
    return [_tasks(cell, tensor, step, t) for (cell, tensor, _, step), t in zip(run, plans)]


__all__ = ["DimOf", "plan_run"]

"""The work of one planning call: every slice to move, largest first, and its tasks.

Most slices of a large plan go point to point: one holder, one needer on another
device, nothing to copy (every cell of an all-to-all). Such a slice's task is fixed, a
send from its holder, unless a broadcast may relay it through another NIC of its
host (:meth:`Loads.relay_chain`). The work list keeps those slices as columns (numpy
arrays), charges their bytes to the NICs in bulk between the choices of the other
slices (the loads a choice reads are sums of whole bytes, exact in any order), and
builds their tasks once the global order is known. The other slices go through their
strategy's cell planner one by one, in the same largest-first order, so a plan is the
same as planning every slice one by one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.cells.balance import Loads, may_relay_ends
from reshard.planner.cells.cell_tasks import RUN_PLANNERS, CellPlanner, plan_broadcasts
from reshard.planner.cells.cell_tasks import fan_out as split_chains
from reshard.planner.cells.decompose import Cell, CellTable
from reshard.planner.cells.expect_runs import MIN_RUN as EXPECT_RUN
from reshard.planner.cells.expect_runs import expect_run
from reshard.planner.cells.whole_sums import EXACT, stays_whole
from reshard.planner.schedule.array_key import ArrayKey
from reshard.planner.schedule.broadcast_columns import BroadcastColumns
from reshard.planner.schedule.demand_memo import DemandMemo as _Demand
from reshard.planner.schedule.device_arrays import DeviceArrays, device_arrays
from reshard.planner.schedule.end_sums import EndSums, end_sums
from reshard.planner.schedule.kept_rows import KeptRows, uncut
from reshard.planner.schedule.order import OrderKeys
from reshard.planner.schedule.point_rows import PointColumns, PointToPoint, cat
from reshard.planner.schedule.send_columns import OrderedTasks
from reshard.planner.schedule.send_order import in_order
from reshard.planner.values.resources import NIC_IN, NIC_OUT
from reshard.planner.values.tasks import Task

Splitter = Callable[[Cell, int], list[Cell]]
"""Pieces of a cell of ``nbytes`` bytes to plan separately (balance over NICs); whether
it cuts a cell is decided by the cell's holders, needers and bytes alone (the cell
itself, ``[cell]``, where whole)."""

_SIZE = attrgetter("size")

BULK_FLUSH = 32
"""Below this many point-to-point slices, charge them one by one (numpy's fixed cost)."""



class WorkList:
    """The slices of one planning call (an accumulator local to that call); ``devices``:
    the cluster's :func:`~reshard.planner.schedule.device_arrays.device_arrays` (fill 0)
    where the call has them (its :class:`~reshard.planner.cuts.Cut`'s), else built.

    Slices are added tensor by tensor, in planning order: as :class:`Cell` objects
    (:meth:`add_cells`, small tensors) or as a :class:`CellTable` (:meth:`add_table`,
    whose point-to-point rows stay columns); :meth:`plan` then plans them largest
    first (ties in the order added) and returns every task in the global order.
    """

    def __init__(self, cluster: Cluster, loads: Loads,
                 devices: DeviceArrays | None = None) -> None:
        self.cluster = cluster
        self.loads = loads
        # 0 at an id that names no device: end_sums bins the whole NIC array; given
        # (``devices``, only read) where a planning call's work lists share them
        self._host, self._nic = device_arrays(cluster, 0) if devices is None else devices
        # every slice, in the order added: its bytes, the step it may start at, and
        # where it is (>= 0: a point-to-point row; < 0: general cell -1 - ref); chunks
        # of arrays, and the slices added since the last chunk as lists
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._nbytes: list[int] = []
        self._after: list[int] = []
        self._ref: list[int] = []
        self._general: list[tuple[int, Cell]] = []  # (tensor, cell)
        self._rows: KeptRows | None = None  # general slices after those, kept as rows
        self._p2p = PointToPoint()
        self._last_step: dict[int, int] = {}  # tensor -> the step its last cells start at
        self._planned: _Planned | None = None  # the choices plan() made, for assemble()
        self._end_sums: tuple[np.ndarray, np.ndarray, np.ndarray, EndSums] | None = None

    @property
    def general(self) -> list[tuple[int, Cell]]:
        """The general slices (tensor, cell), in the order added: rows kept as a table's
        (:meth:`add_table`) built as cells first (the same cells, in order)."""
        rows = self._rows
        if rows is not None:
            self._rows = None
            self._general.extend([(rows.tensor, c) for c in rows.table.cells()])
        return self._general

    # ----- adding slices -------------------------------------------------------------
    def add_cells(self, tensor: int, cells: Sequence[Cell], itemsize: int,
                  after: Sequence[int], split: Splitter | None, whole_below: int = 0) -> None:
        """Add ``cells`` of tensor ``tensor``; ``after[i]``: the step cell ``i`` may start
        at; ``split`` (if any) cuts a cell into pieces planned separately, except a cell
        of fewer than ``whole_below`` bytes, which it would leave whole (not asked)."""
        general = self.general
        if after:
            self._last_step[tensor] = max(self._last_step.get(tensor, 0), max(after))
        if split is not None and cells and \
                max(map(_SIZE, cells)) * itemsize < whole_below:
            split = None  # every cell whole, as split would leave it
        if split is None:  # one slice a cell: the same lists, extended at once
            n, start = min(len(cells), len(after)), len(general)
            if n < len(cells) or n < len(after):  # as zip pairs them
                cells, after = cells[:n], after[:n]
            self._nbytes.extend([cell.size * itemsize for cell in cells])
            self._after.extend(after)
            self._ref.extend(range(-1 - start, -1 - start - n, -1))
            general.extend([(tensor, cell) for cell in cells])
            return
        nbytes, afters, refs = self._nbytes, self._after, self._ref
        for cell, af in zip(cells, after):
            nb = cell.size * itemsize  # under whole_below: whole, as split would leave it
            for piece in (split(cell, nb) if nb >= whole_below else (cell,)):
                nbytes.append(piece.size * itemsize)
                afters.append(af)
                refs.append(-1 - len(general))
                general.append((tensor, piece))

    def add_table(self, tensor: int, table: CellTable, itemsize: int, after: np.ndarray,
                  split: Splitter | None, whole_below: int = 0) -> None:
        """:meth:`add_cells` for the rows of ``table``; its point-to-point rows stay
        columns (they are never split: one holder NIC, one needer NIC), and, where none
        is and ``split`` cuts none (``whole_below``: bytes under which it cuts no cell,
        :func:`~reshard.planner.schedule.kept_rows.uncut`), every row stays the table's
        (:class:`~reshard.planner.schedule.kept_rows.KeptRows`)."""
        n = len(table)
        if not n:
            return
        self._flush()
        self._last_step[tensor] = max(self._last_step.get(tensor, 0), int(after.max()))
        nbytes = table.size * itemsize
        root, recv = _point_to_point(table)
        p2p = root >= 0
        rows = np.flatnonzero(p2p)
        if not rows.size and self._rows is None and uncut(table, nbytes, split, whole_below):
            start = len(self._general)  # kept as rows until a cell is asked for
            self._rows = KeptRows(tensor, table, start)
            self._chunks.append((nbytes, np.asarray(after, dtype=np.int64),
                                 -1 - start - np.arange(n, dtype=np.int64)))
            return
        pick = slice(None) if rows.size == n else rows  # every row: the columns themselves
        refs = self._p2p.add(tensor, table, rows, root[pick], recv[pick], nbytes[pick])
        if rows.size == n:
            self._chunks.append((nbytes, after, refs))
            return
        p_ref = np.full(n, -1, dtype=np.int64)
        p_ref[rows] = refs
        cells = iter(table.cells(np.flatnonzero(~p2p)))  # the general rows, in order
        general, sizes, afters, refs_ = self.general, self._nbytes, self._after, self._ref
        for nb, af, pr in zip(nbytes.tolist(), after.tolist(), p_ref.tolist()):
            if pr >= 0:
                sizes.append(nb)
                afters.append(af)
                refs_.append(pr)
                continue
            cell = next(cells)
            for piece in (split(cell, nb) if split is not None else (cell,)):
                sizes.append(piece.size * itemsize)
                afters.append(af)
                refs_.append(-1 - len(general))
                general.append((tensor, piece))
        self._flush()

    def point_to_point(self) -> PointColumns:
        """The point-to-point rows added so far, column by column."""
        return self._p2p.columns()

    def least_tasks(self, point_to_point: bool) -> int:
        """Tasks the slices added so far give at the least: a point-to-point row one
        send; a cell one copy a needer that holds it and, for the others, one task
        (a broadcast, or an all-gather's first) or, ``point_to_point``, one send each
        (as :mod:`reshard.planner.cells.cell_tasks` plans them)."""
        rows = self._p2p.count
        cells = 0
        for _, cell in self.general:
            held = len(cell.needers & cell.holders)
            rest = len(cell.needers) - held
            cells += held + (rest if point_to_point else min(rest, 1))
        return rows + cells

    def steps(self) -> tuple[list[int], np.ndarray]:
        """The step each slice added so far may start at: per general cell (in the
        order of :attr:`general`), and per point-to-point row (that of
        :meth:`point_to_point`)."""
        self._flush()
        after, ref = cat([c[1] for c in self._chunks]), cat([c[2] for c in self._chunks])
        cells = [0] * len(self.general)
        rows = np.zeros(self._p2p.count, dtype=np.int64)
        general = ref < 0
        for r, af in zip((-1 - ref[general]).tolist(), after[general].tolist()):
            cells[r] = af
        rows[ref[~general]] = after[~general]
        return cells, rows

    def signature(self) -> tuple[object, ...]:
        """What the slices added so far are, to compare with another work list's before
        either is planned: equal signatures plan to equal tasks (every choice reads
        the slices, their order and steps, and loads both start from equally). The
        point-to-point rows count by the tables they come from (the same objects)."""
        self._flush()
        kept = self._rows  # rows kept as a table's count by the table (the same object)
        return (tuple(self._general),
                None if kept is None else (kept.tensor, id(kept.table), kept.start),
                tuple(ArrayKey(a) for c in self._chunks for a in c),
                tuple((tensor, id(table), ArrayKey(rows))
                      for tensor, table, rows, *_ in self._p2p._parts))

    def _flush(self) -> None:
        if self._ref:
            self._chunks.append((np.array(self._nbytes, dtype=np.int64),
                                 np.array(self._after, dtype=np.int64),
                                 np.array(self._ref, dtype=np.int64)))
            self._nbytes, self._after, self._ref = [], [], []

    # ----- planning --------------------------------------------------------------------
    def plan(self, planner: CellPlanner, itemsizes: Sequence[int], expect: bool,
             relays: bool, fan_out: bool = False,
             first: Sequence[Task] = ()) -> OrderedTasks:
        """Plan every slice, largest first; return ``first`` (tasks planned before, e.g.
        reductions) and every slice's tasks, in the global order (the sends still
        columns: :class:`~reshard.planner.schedule.send_columns.OrderedTasks`).

        Args:
            planner: the strategy's cell planner, for the general cells.
            itemsizes: bytes per element of each tensor.
            expect: account every slice's expected NIC demand first
                (:meth:`Loads.expect`; broadcasts on hosts with several NICs).
            relays: transfers may be relayed (broadcast): a point-to-point row one of
                whose ends' NICs may relay is planned as a general cell.
            fan_out: a broadcast of a cell that starts at a step after 0 (a reduced
                piece) and before its tensor's last such step fans out inside its last
                host at the next step (:func:`~reshard.planner.cells.cell_tasks.fan_out`):
                that step's transfers of the next piece hide the fan-out.
            first: tasks planned before the slices.
        """
        self._planned = self._plan_slices(planner, itemsizes, expect, relays, first)
        return self.assemble(fan_out)

    def _plan_slices(self, planner: CellPlanner, itemsizes: Sequence[int], expect: bool,
                     relays: bool, first: Sequence[Task]) -> _Planned:
        """:meth:`plan`'s choices: every slice planned, largest first (the loads they
        steer), kept for :meth:`assemble`."""
        self._flush()
        nbytes = cat([c[0] for c in self._chunks])
        after = cat([c[1] for c in self._chunks])
        ref = cat([c[2] for c in self._chunks])
        p2p = self._p2p.columns()
        if expect:
            self._expect(nbytes, ref, p2p)
        if relays and self.cluster.nics_per_host > 1 and len(p2p.root):
            ref = self._relayed(ref, p2p)
        as_added = ref, nbytes
        order = largest_first(nbytes)  # ties as added; None: in that order already
        if order is not None:
            ref, after, nbytes = ref[order], after[order], nbytes[order]
        general = np.flatnonzero(ref < 0).tolist()
        if not general and len(ref) >= BULK_FLUSH and int(nbytes.sum()) < EXACT and \
                _charge_bulk(self, as_added[0], p2p, as_added[1]):
            # in bulk (keys written in index order), every sum exact in any order: the
            # rows as added, not gathered into this order
            return _Planned(tuple(first), ref, after, general, [], [], [], p2p)
        refs, steps = ref[general].tolist(), after[general].tolist()
        tasks: list[list[Task]] = []
        if len(general) == len(ref):  # every slice general: one run, nothing to charge
            keyed = self._rows.keyed_plan(refs, steps, itemsizes[self._rows.tensor],
                                          self.loads) \
                if self._rows is not None and RUN_PLANNERS.get(planner) is plan_broadcasts \
                else None  # kept rows: their tasks' order keys read from the columns
            if keyed is not None:  # their tasks kept as columns too
                return _Planned(tuple(first), ref, after, general, refs, steps, keyed[0], p2p,
                                keyed[1])
            tasks.extend(self._general_run(refs, steps, planner, itemsizes))
            return _Planned(tuple(first), ref, after, general, refs, steps, tasks, p2p)
        done = start = 0  # start: the first general slice since the last point-to-point
        for i, k in enumerate(general):
            if k > done:  # the point-to-point slices before this general one, in bulk
                tasks.extend(self._general_run(refs[start:i], steps[start:i], planner,
                                               itemsizes))
                start = i
                self._charge(ref[done:k], p2p, nbytes[done:k])
            done = k + 1
        tasks.extend(self._general_run(refs[start:], steps[start:], planner, itemsizes))
        self._charge(ref[done:], p2p, nbytes[done:])
        return _Planned(tuple(first), ref, after, general, refs, steps, tasks, p2p)

    def assemble(self, fan_out: bool) -> OrderedTasks:
        """The planned slices' tasks (:meth:`plan`, whose choices are made once) in the
        global order, the broadcasts of pipelined pieces fanned out or not (``fan_out``,
        as :meth:`plan`'s: it changes no choice, only what a chain becomes)."""
        planned = self._planned
        if planned is None:
            raise ValueError("WorkList.assemble needs the slices planned first (WorkList.plan)")
        ref, after, p2p = planned.ref, planned.after, planned.p2p
        if len(planned.general) == len(ref) and not (fan_out and self.fanned(planned)):
            # every slice general, none fanned out: the tasks one after another (kept rows)
            kept = planned.tasks if isinstance(planned.tasks, BroadcastColumns) else None
            every = [*planned.first, *itertools.chain.from_iterable(() if kept else planned.tasks)]
            none = np.full(len(p2p.root), -1, dtype=np.int64)
            return self._ordered(every, np.arange(len(every), dtype=np.int64), p2p, none,
                                 np.zeros(len(p2p.root), dtype=np.int64), planned.keys, kept)
        objects: list[Task] = list(planned.first)
        obj_seq: list[int] = list(range(len(objects)))
        if not planned.general and len(ref) == len(p2p.root):  # every slice a send
            p_seq, p_step = _as_planned(ref, after, len(objects))
            return self._ordered(objects, np.array(obj_seq, dtype=np.int64), p2p, p_seq, p_step)
        seq = len(objects)
        p_seq = np.full(len(p2p.root), -1, dtype=np.int64)  # -1: planned as general
        p_step = np.zeros(len(p2p.root), dtype=np.int64)
        done = 0
        for k, r, step, tasks in zip([*planned.general, len(ref)], [*planned.refs, 0],
                                     [*planned.steps, 0], [*planned.tasks, []]):
            if k > done:  # the point-to-point slices before this general one
                rows = ref[done:k]
                p_seq[rows] = seq + np.arange(k - done)
                p_step[rows] = after[done:k]
                seq += k - done
            if k == len(ref):
                break
            tensor = self._tensor_of(r)
            if fan_out and 0 < step < self._last_step[tensor]:
                tasks = split_chains(tasks, self.loads.host)
            objects.extend(tasks)
            obj_seq.extend(range(seq, seq + len(tasks)))
            seq += len(tasks)
            done = k + 1
        return self._ordered(objects, np.array(obj_seq, dtype=np.int64), p2p, p_seq, p_step)

    def fanned(self, planned: _Planned | None = None) -> list[list[Task]]:
        """The planned tasks (``planned``, default :meth:`plan`'s) of each general slice
        whose chains :meth:`assemble` with ``fan_out`` splits: it starts after step 0
        and before its tensor's last such step."""
        p, tensor, last = planned or self._planned, self._tensor_of, self._last_step
        if p is None:
            raise ValueError("WorkList.fanned needs the slices planned first (WorkList.plan)")
        return [t for r, s, t in zip(p.refs, p.steps, p.tasks) if 0 < s < last[tensor(r)]]

    def _tensor_of(self, ref: int) -> int:
        """The tensor of general slice ``ref`` (no cell built for rows kept as a table's)."""
        rows = self._rows
        if rows is not None and -1 - ref >= rows.start:
            return rows.tensor
        return self._general[-1 - ref][0]

    def _general_run(self, refs: list[int], steps: list[int], planner: CellPlanner,
                     itemsizes: Sequence[int]) -> list[list[Task]]:
        """The tasks of each general cell ``refs[i]`` at ``steps[i]`` (:meth:`plan`'s
        arguments), in turn: by the strategy's run planner where it has one
        (:data:`~reshard.planner.cells.cell_tasks.RUN_PLANNERS`)."""
        by_run, kept = RUN_PLANNERS.get(planner), self._rows
        if by_run is plan_broadcasts and kept is not None:  # kept rows: read as columns
            got = kept.plan(refs, steps, itemsizes[kept.tensor], self.loads)
            if got is not None:
                return got
        general, loads = self.general, self.loads
        cells = [(cell, tensor, itemsizes[tensor], step) for (tensor, cell), step
                 in zip(map(general.__getitem__, [-1 - r for r in refs]), steps)]
        if by_run is not None:
            return by_run(cells, loads)
        return [planner(cell, tensor, size, loads, step) for cell, tensor, size, step in cells]

    def _expect(self, nbytes: np.ndarray, ref: np.ndarray, p2p: PointColumns) -> None:
        """:meth:`Loads.expect` for every slice, in the order added (sums of fractions
        of bytes depend on the order; sums of whole bytes do not)."""
        loads = self.loads
        if (ref >= 0).all():
            _add_expected(self, *_ends(p2p, ref), nbytes)
            return
        kept = self._rows
        if kept is not None and not kept.start and len(ref) == len(kept.table) >= EXPECT_RUN \
                and (ref < 0).all() and kept.expect(loads, nbytes.tolist()):
            loads.expected_changed()  # every slice a kept row, as added: read as columns
            return
        if len(ref) >= EXPECT_RUN and (ref < 0).all() and \
                expect_run(loads, [cell for _, cell in map(self.general.__getitem__,
                                                           (-1 - ref).tolist())],
                           nbytes.tolist()):
            loads.expected_changed()
            return
        expected, nic, host = loads.expected, loads.nic, loads.host
        root, recv = p2p.root.tolist(), p2p.recv.tolist()
        expect, general = _Demand(loads).expect, self.general  # no slice added here
        for nb, r in zip(nbytes.tolist(), ref.tolist()):
            if r >= 0:
                a, b = root[r], recv[r]
                if host(a) != host(b):
                    expected[(NIC_OUT, nic(a))] += nb
                    expected[(NIC_IN, nic(b))] += nb
            else:
                cell = general[-1 - r][1]
                expect(cell.holders, cell.needers, nb)
        loads.expected_changed()

    def _relayed(self, ref: np.ndarray, p2p: PointColumns) -> np.ndarray:
        """``ref`` with the point-to-point rows one of whose ends' NICs may relay
        (:meth:`Loads.may_relay_end`) turned into general cells."""
        loads = self.loads
        devices = self.cluster.devices
        flags = {}
        for direction in (NIC_OUT, NIC_IN):
            flag = np.zeros(len(self._host), dtype=bool)
            flag[list(devices)] = may_relay_ends(loads, direction, devices)
            flags[direction] = flag
        cross = self._host[p2p.root] != self._host[p2p.recv]
        moved = np.flatnonzero(cross & (flags[NIC_OUT][p2p.root] | flags[NIC_IN][p2p.recv]))
        if not moved.size:
            return ref
        new_ref = np.arange(len(p2p.root), dtype=np.int64)
        new_ref[moved] = -1 - len(self.general) - np.arange(len(moved))
        for r in moved.tolist():
            cell = Cell(p2p.box_of(r), frozenset((int(p2p.root[r]),)),
                        frozenset((int(p2p.recv[r]),)))
            self.general.append((int(p2p.tensor[r]), cell))
        return np.where(ref >= 0, new_ref[np.maximum(ref, 0)], ref)

    def _charge(self, rows: np.ndarray, p2p: PointColumns, nbytes: np.ndarray) -> None:
        """:meth:`Loads.charge` the point-to-point ``rows`` (in bulk: whole bytes)."""
        if not rows.size:
            return
        if len(rows) >= BULK_FLUSH and _charge_bulk(self, rows, p2p, nbytes):
            return
        charge = self.loads.charge
        a, b = _ends(p2p, rows)
        for r, s, nb in zip(a.tolist(), b.tolist(), nbytes.tolist()):
            charge(r, (s,), nb)

    def end_sums(self, root: np.ndarray, recv: np.ndarray, nbytes: np.ndarray) -> EndSums:
        """:func:`~reshard.planner.schedule.end_sums.end_sums` of these rows, found once
        for the same arrays asked again (the expected demand and the charge of one plan's
        rows: the arrays are only read)."""
        memo = self._end_sums
        if memo is not None and memo[0] is root and memo[1] is recv and memo[2] is nbytes:
            return memo[3]
        got = end_sums(root, recv, nbytes, self._host, self._nic)
        self._end_sums = (root, recv, nbytes, got)
        return got

    def _ordered(self, objects: list[Task], obj_seq: np.ndarray, p2p: PointColumns,
                 p_seq: np.ndarray, p_step: np.ndarray, known: OrderKeys | None = None,
                 kept: BroadcastColumns | None = None) -> OrderedTasks:
        """Every task in the global order (:func:`~reshard.planner.schedule.send_order.
        in_order`)."""
        return in_order(objects, obj_seq, p2p, p_seq, p_step, self._host, self.cluster,
                        known, kept)


def largest_first(nbytes: np.ndarray) -> np.ndarray | None:
    """``np.argsort(-nbytes, kind="stable")`` (largest first, ties in index order), or
    None where that is every index in order (``nbytes`` never grows: nothing to gather)."""
    if not bool((nbytes[1:] > nbytes[:-1]).any()):
        return None
    return np.argsort(-nbytes, kind="stable")


def _as_planned(ref: np.ndarray, after: np.ndarray, first: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Where every slice is a point-to-point row, ``ref`` (each row once, in planning
    order) and ``after`` their steps, the slices planned after ``first`` tasks: each
    row's planning position and step. Where ``ref`` is every row in order, those are
    ``first`` on and ``after`` itself (the values scattering would give)."""
    n = len(ref)
    if n and int(ref[0]) == 0 and bool((ref[1:] - ref[:-1] == 1).all()):
        return np.arange(first, first + n, dtype=np.int64), after.astype(np.int64, copy=False)
    p_seq = np.full(n, -1, dtype=np.int64)
    p_step = np.zeros(n, dtype=np.int64)
    p_seq[ref] = first + np.arange(n)
    p_step[ref] = after
    return p_seq, p_step


def _add_expected(work: WorkList, root: np.ndarray, recv: np.ndarray, nbytes: np.ndarray
                  ) -> None:
    """Point-to-point transfers' expected NIC demand (of ``work``'s loads), in bulk where every
    expectation it adds to is a whole number below 2**53 (:func:`stays_whole`) (else one by one,
    in the order given)."""
    sums = work.end_sums(root, recv, nbytes)
    expected = work.loads.expected
    adds = []
    for direction, per_nic in ((NIC_OUT, sums.nic_out), (NIC_IN, sums.nic_in)):
        touched = np.flatnonzero(per_nic).tolist()
        adds.append(([(direction, n) for n in touched], touched, per_nic))
    if all(stays_whole(expected, keys, sums[touched]) for keys, touched, sums in adds):
        for keys, touched, per_nic in adds:
            for key, n in zip(keys, touched):
                expected[key] += int(per_nic[n])
    else:
        nic = work._nic
        cross = work._host[root] != work._host[recv]
        for a, b, nb in zip(root[cross].tolist(), recv[cross].tolist(),
                            nbytes[cross].tolist()):
            expected[(NIC_OUT, int(nic[a]))] += nb
            expected[(NIC_IN, int(nic[b]))] += nb
    work.loads.expected_changed()


def _charge_bulk(work: WorkList, rows: np.ndarray, p2p: PointColumns, nbytes: np.ndarray) -> bool:
    """:meth:`WorkList._charge` in bulk (keys written in index order) where every load it
    adds to is a whole number and stays below 2**53 (:func:`stays_whole`; every sum then exact
    in any order); else False, having changed nothing (a reduction may have left
    fractions: the rows then go one by one)."""
    loads = work.loads
    sums = work.end_sums(*_ends(p2p, rows), nbytes)
    adds = []
    for table, per in ((loads.dev_out, sums.dev_out), (loads.dev_in, sums.dev_in),
                       (loads.nic_out, sums.nic_out), (loads.nic_in, sums.nic_in)):
        touched = np.flatnonzero(per).tolist()
        if not stays_whole(table, touched, per[touched]):
            return False
        adds.append((table, touched, per))
    for table, touched, per in adds:
        for i in touched:
            table[i] += int(per[i])
    return True


def _ends(p2p: PointColumns, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The roots and receivers of the point-to-point ``rows``: the columns themselves
    where ``rows`` is every row in order (the same values, not gathered)."""
    n = len(p2p.root)  # every row in order: n rows rising one by one from 0 (no arange)
    if len(rows) == n and (not n or bool(rows[0] == 0 and rows[-1] == n - 1 and
                                         (rows[1:] > rows[:-1]).all())):
        return p2p.root, p2p.recv
    return p2p.root[rows], p2p.recv[rows]


def _point_to_point(table: CellTable) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``table``: its holder and needer if the row goes point to point (one
    holder, one needer, another device), else -1 and -1."""
    def single(sets: Sequence[frozenset[int]]) -> np.ndarray:
        return np.array([next(iter(s)) if len(s) == 1 else -1 for s in sets] + [-1],
                        dtype=np.int64)

    root = single(table.holder_sets)[table.holder]
    recv = single(table.needer_sets)[table.needer]
    p2p = (root >= 0) & (recv >= 0) & (root != recv)
    if bool(p2p.all()):  # every row: the same values as choosing
        return root, recv
    return np.where(p2p, root, -1), np.where(p2p, recv, -1)


@dataclass(frozen=True, eq=False)
class _Planned:
    """What :meth:`WorkList.plan` chose, in its largest-first order: the tasks planned
    before the slices, each slice's reference and step, the general slices' positions,
    references, steps and tasks, and the point-to-point rows."""

    first: tuple[Task, ...]
    ref: np.ndarray
    after: np.ndarray
    general: list[int]
    refs: list[int]
    steps: list[int]
    tasks: Sequence[list[Task]]  # kept rows': their columns (BroadcastColumns)
    p2p: PointColumns
    keys: OrderKeys | None = None  # the tasks' order keys, known (seq aside)

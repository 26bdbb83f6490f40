"""General slices kept as a table's rows: a work list's cells not built until asked for.

A partial source's reduced pieces sent to every destination host are 131,072 rows of
one :class:`~reshard.planner.cells.decompose.CellTable` at 1,024 devices, none point
to point (each from one root to one host's devices) and none cut for balance. A work
list (:class:`~reshard.planner.schedule.work.WorkList`) keeps such a table's rows as
:class:`KeptRows`, its last general slices; where a planning step reads every general
slice from them, it reads the table's columns: the expected demand
(:meth:`KeptRows.expect`, :func:`~reshard.planner.cells.expect_runs.expect_coded`) and
the broadcasts planned by rounds (:meth:`KeptRows.plan`, :func:`~reshard.planner.
cells.broadcast_rows.plan_rows`), the same sums, loads and tasks as from the cells.
Anything else builds the cells first (the same cells, in the same order: those
:meth:`~reshard.planner.cells.decompose.CellTable.cells` builds), as does a step whose
fast path declines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from reshard.planner.cells.balance import Loads
from reshard.planner.cells.broadcast_rows import plan_chains, plan_rows
from reshard.planner.cells.decompose import Cell, CellTable
from reshard.planner.cells.expect_runs import expect_coded
from reshard.planner.cells.set_codes import first_order
from reshard.planner.schedule.broadcast_columns import BroadcastColumns
from reshard.planner.schedule.device_arrays import device_arrays
from reshard.planner.schedule.order import PHASE, OrderKeys
from reshard.planner.values.tasks import Task, TaskKind

Pieces = Callable[[Cell, int], list[Cell]]
"""A work list's splitter (:data:`~reshard.planner.schedule.work.Splitter`): the pieces
of a cell of ``nbytes`` bytes; whether it cuts a cell is decided by the cell's holders,
needers and bytes alone (the cell itself, ``[cell]``, where whole)."""


KINDS_ASKED = 4096
"""Distinct (holders, needers, bytes) from which :func:`uncut` asks no splitter (it
answers False: the rows are planned as cells)."""


def uncut(table: CellTable, nbytes: np.ndarray, split: Pieces | None,
          whole_below: int = 0) -> bool:
    """Whether ``split`` leaves every row of ``table`` (``nbytes`` each) whole: its one
    piece the cell itself. ``whole_below``: bytes under which ``split`` cuts no cell
    (its caller's word): rows all under it are whole unasked. Else one row of each
    distinct (holders, needers, bytes) is asked (a splitter decides from those alone:
    :data:`Pieces`), where they are fewer than :data:`KINDS_ASKED`."""
    if split is None or not len(nbytes) or int(nbytes.max()) < whole_below:
        return True
    kinds = np.stack([table.holder, table.needer, nbytes], axis=1)
    _, first = np.unique(kinds, axis=0, return_index=True)
    if len(first) >= KINDS_ASKED:
        return False
    first = np.sort(first)
    for cell, nb in zip(table.cells(first), nbytes[first].tolist()):
        got = split(cell, nb)
        if len(got) != 1 or got[0] is not cell:
            return False
    return True


@dataclass(frozen=True, eq=False)
class KeptRows:
    """Every row of ``table``, of tensor ``tensor``, kept as general slices ``start``
    onwards (the last general slices of their work list): general slice ``start + i``
    is row ``i``'s cell."""

    tensor: int
    table: CellTable
    start: int

    def rows(self, refs: Sequence[int]) -> np.ndarray | None:
        """The rows of the general slices ``refs`` (a work list's references: slice
        ``-1 - ref``), or None where some is not a kept row."""
        if not refs or -1 - max(refs) < self.start:
            return None
        return -1 - self.start - np.array(refs, dtype=np.int64)

    def expect(self, loads: Loads, nbytes: Sequence[int]) -> bool:
        """:func:`~reshard.planner.cells.expect_runs.expect_run` of every row's cell in
        order (``nbytes`` each), read from the columns
        (:func:`~reshard.planner.cells.expect_runs.expect_coded`); else False, having
        changed nothing."""
        table = self.table
        holder, hfirst = first_order(table.holder)  # numbered as set_codes numbers
        needer, nfirst = first_order(table.needer)  # the cells' (their own objects)
        return expect_coded(loads, holder,
                            [table.holder_sets[k] for k in table.holder[hfirst].tolist()],
                            needer,
                            [table.needer_sets[k] for k in table.needer[nfirst].tolist()],
                            nbytes)

    def keyed_plan(self, refs: Sequence[int], steps: Sequence[int], itemsize: int,
                   loads: Loads) -> tuple[BroadcastColumns, OrderKeys] | None:
        """:meth:`plan`'s tasks kept as columns (:class:`~reshard.planner.schedule.
        broadcast_columns.BroadcastColumns`, the same values), and their order keys
        read from the columns (their planning positions ``seq`` left 0: the caller's):
        what :meth:`~reshard.planner.schedule.order.OrderKeys.of_tasks` reads of each
        task (a broadcast: its step, phase, host distance from its root to its first
        receiver, bytes, tensor, box and root), the same values."""
        rows = self.rows(refs)
        if rows is None:
            return None
        got = plan_chains(self.table, rows, itemsize, loads)
        if got is None:
            return None
        cols = BroadcastColumns.of(self.tensor, self.table, rows, *got, list(steps))
        table, n = self.table, len(cols)
        cluster = loads.cluster
        host = device_arrays(cluster, -1)[0]  # read only at the tasks' devices
        first = np.array([c[0] for c in cols.chains], dtype=np.int64)[cols.chain]
        hosts = host[np.concatenate([cols.root, first])]  # each root's and first receiver's
        box = np.empty((n, 2 * table.lo.shape[1]), dtype=np.int64)
        box[:, 0::2], box[:, 1::2] = table.lo[rows], table.hi[rows]
        return cols, OrderKeys(
            cols.step.copy(), np.full(n, PHASE[TaskKind.BROADCAST], np.int64),
            (hosts[n:] - hosts[:n]) % max(1, cluster.num_hosts), cols.nbytes.copy(),
            np.full(n, self.tensor, np.int64), box, cols.root.copy(),
            np.zeros(n, dtype=np.int64))

    def plan(self, refs: Sequence[int], steps: Sequence[int], itemsize: int, loads: Loads
             ) -> list[list[Task]] | None:
        """:func:`~reshard.planner.cells.cell_tasks.plan_broadcasts` of the general
        slices ``refs`` at ``steps`` where every one is a kept row and the run is
        planned by rounds (:func:`~reshard.planner.cells.broadcast_rows.plan_rows`);
        else None, having changed no load."""
        rows = self.rows(refs)
        if rows is None:
            return None
        return plan_rows(self.table, rows, self.tensor, itemsize, steps, loads)


__all__ = ["KINDS_ASKED", "KeptRows", "Pieces", "uncut"]

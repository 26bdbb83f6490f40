"""A run of one-holder broadcasts read from a :class:`~reshard.planner.cells.decompose.
CellTable`'s rows: :func:`~reshard.planner.cells.broadcast_runs.plan_run` without a
:class:`~reshard.planner.cells.decompose.Cell` per row.

A partial source's reduced pieces sent to every destination host are 131,072 rows at
1,024 devices, each from one root to the devices of one other host. :func:`plan_run`
reads of each cell its holders, needers, size and box only; here they are the table's
columns: a row's root is its holder set's one device, its group its needer set's
(numbered in the order first seen, as :func:`plan_run` numbers them), its bytes its
size column times the item size (where no size can overflow it), its box the table's
(:meth:`CellTable.boxes`). The rounds, the charges and the tasks are
:func:`~reshard.planner.cells.broadcast_runs.plan_groups`' and
:func:`~reshard.planner.cells.new_tasks.broadcast_rows_tasks`': the same chains, loads
and tasks as :func:`plan_run` of the rows' cells in the same order. Where
:func:`plan_run` would not plan the run by rounds (or the rows are not all of one
holder), :func:`plan_rows` answers None having changed no load (only the memos of
:func:`one_host` and :meth:`Loads.may_relay_end`, pure functions of the cluster and
of the expectations), and the caller plans the cells."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from reshard.planner.cells.balance import Loads
from reshard.planner.cells.broadcast_runs import MIN_RUN, Found, Group, one_host, plan_groups
from reshard.planner.cells.decompose import CellTable
from reshard.planner.cells.new_tasks import broadcast_rows_tasks
from reshard.planner.cells.set_codes import first_order
from reshard.planner.values.resources import NIC_OUT
from reshard.planner.values.tasks import Task


def plan_rows(table: CellTable, rows: np.ndarray, tensor: int, itemsize: int,
              steps: Sequence[int], loads: Loads) -> list[list[Task]] | None:
    """:func:`~reshard.planner.cells.broadcast_runs.plan_run` of the run of ``table``'s
    ``rows`` (in that order; tensor ``tensor``, ``itemsize`` bytes an element, row
    ``rows[i]`` at step ``steps[i]``) where it plans them by rounds: the same tasks
    and loads; else None, having changed no load (module docstring)."""
    got = plan_chains(table, rows, itemsize, loads)
    if got is None:
        return None
    roots, chains, nbytes = got
    return broadcast_rows_tasks(tensor, table.boxes(rows), steps, roots, chains, nbytes)


def plan_chains(table: CellTable, rows: np.ndarray, itemsize: int, loads: Loads
                ) -> tuple[list[int], list[tuple[int, ...]], list[int]] | None:
    """What :func:`plan_rows` plans, as each row's root, chain and bytes (its tasks'
    values, no task built): the same loads; None where :func:`plan_rows` is."""
    if len(rows) < MIN_RUN:
        return None
    found = row_groups(table, rows, itemsize, loads)
    if found is None:
        return None
    chains = plan_groups(found, loads)
    if chains is None:
        return None
    return found[2], chains, found[3]


def row_groups(table: CellTable, rows: np.ndarray, itemsize: int, loads: Loads
               ) -> Found | None:
    """What :func:`~reshard.planner.cells.broadcast_runs._groups` finds of the rows'
    cells (their receiver groups, numbered in the order first seen; each row's group,
    root and bytes), or None where it answers None (or a row's bytes might not fit
    int64: then the cells answer)."""
    if not len(rows) or not _fits(table, itemsize):
        return None
    root = _singles(table.holder_sets)[table.holder[rows]]
    if (root < 0).any():  # not one holder
        return None
    group_of, first = first_order(_by_value(table.needer_sets)[table.needer[rows]])
    groups: list[Group] = []
    for k in table.needer[rows][first].tolist():
        got = one_host(loads, table.needer_sets[k])
        if got is None:
            return None
        groups.append(got)
    roots, at = np.unique(root, return_inverse=True)
    host = loads.host
    root_host = np.array([host(r) for r in roots.tolist()], dtype=np.int64)
    group_host = np.array([h for h, _ in groups], dtype=np.int64)
    if (root_host[at.reshape(-1)] == group_host[group_of]).any():  # into its own host
        return None
    may = loads.may_relay_end
    if any(may(NIC_OUT, r) for r in root[first_order(root)[1]].tolist()):  # first seen
        return None
    nics = [n for _, pairs in groups for _, n in pairs]
    if len(set(nics)) != len(nics):
        return None
    nbytes = table.size[rows] * itemsize
    return groups, group_of.tolist(), root.tolist(), nbytes.tolist()


def _fits(table: CellTable, itemsize: int) -> bool:
    """Whether every row's size column is its box's product of extents and that times
    ``itemsize`` fits int64 (as :meth:`CellTable.cells` reads the column)."""
    if not len(table):
        return False
    return bool(math.prod(table.hi.max(axis=0).tolist()) * max(1, itemsize) < 2 ** 63)


def _singles(sets: Sequence[frozenset[int]]) -> np.ndarray:
    """Per set its one member, or -1 where it has not one (a non-negative one)."""
    return np.array([next(iter(s)) if len(s) == 1 and min(s) >= 0 else -1 for s in sets],
                    dtype=np.int64)


def _by_value(sets: Sequence[frozenset[int]]) -> np.ndarray:
    """Per set the index of the first set equal to it (sets equal by value: one group)."""
    first: dict[frozenset[int], int] = {}
    return np.array([first.setdefault(s, i) for i, s in enumerate(sets)], dtype=np.int64)


__all__ = ["plan_chains", "plan_rows", "row_groups"]

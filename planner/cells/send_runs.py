"""A run of point-to-point cells (one holder, one other needer) planned and expected as
whole-byte sums.

A partial sum's reduced pieces sent to a layout that needs each piece on one device
(``RS1+P0 -> S0S1`` at 1,024 devices: 131,072 cells of 8 KiB) are general cells (their
steps follow the reductions), each planned by
:func:`~reshard.planner.cells.cell_tasks.plan_broadcast`: :meth:`Loads.send`, a send
from the holder charged to the holder's and the needer's loads (and NICs, between
hosts) where neither end's NIC may relay (:meth:`Loads.may_relay`); and expected by
:meth:`Loads.expect`: the bytes leaving the holder's NIC and entering the needer's,
between hosts. Where every amount and every load it adds to is a whole number of
bytes and every total stays below 2**53, each addition of the cell-by-cell sums is
exact, so the totals are the same floats in any order: here each key's by one sum,
the keys first written in the order cell by cell writes them. Else the functions
decline, having changed nothing but :meth:`Loads.may_relay_end`'s cache (asked only
what cell by cell asks)."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator, Sequence

import numpy as np

from reshard.planner.cells.balance import Loads
from reshard.planner.cells.decompose import Cell
from reshard.planner.cells.new_tasks import new_task
from reshard.planner.cells.whole_sums import EXACT, stays_whole
from reshard.planner.values.resources import NIC_IN, NIC_OUT
from reshard.planner.values.tasks import Task, TaskKind

Ends = tuple[list[int], list[int]]
"""Each cell's holder and needer."""


def is_send(cell: Cell) -> bool:
    """Whether ``cell`` is point to point: one holder, one needer, not the holder."""
    return len(cell.holders) == 1 and len(cell.needers) == 1 and cell.holders != cell.needers


def ends(cells: Iterator[Cell]) -> Ends | None:
    """Each cell's holder and needer, where each has one holder and one needer that
    differ; else None."""
    holders: list[frozenset[int]] = []
    needers: list[frozenset[int]] = []
    for cell in cells:
        holders.append(cell.holders)
        needers.append(cell.needers)
    if any(map((1).__ne__, map(len, holders))) or any(map((1).__ne__, map(len, needers))):
        return None
    roots = list(itertools.chain.from_iterable(holders))  # each set's one member
    recvs = list(itertools.chain.from_iterable(needers))
    if any(map(operator.eq, roots, recvs)):
        return None
    return roots, recvs


def _sums(keys: np.ndarray, amounts: np.ndarray) -> tuple[list[int], list[int]]:
    """Each distinct key in the order of its first appearance, and the sum of its
    amounts (whole numbers: the caller bounds every sum below :data:`EXACT`)."""
    uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    sums = np.zeros(len(uniq), dtype=np.int64)
    np.add.at(sums, inverse.reshape(-1), amounts)
    order = np.argsort(first, kind="stable")
    return uniq[order].tolist(), sums[order].tolist()


def _add(table: dict, keys: list, sums: list[int]) -> None:  # type: ignore[type-arg]
    for k, s in zip(keys, sums):
        table[k] += s


def _no_relay(loads: Loads, roots: np.ndarray, recvs: np.ndarray) -> bool:
    """Whether no cross-host cell may relay (:meth:`Loads.may_relay` of each, as cell
    by cell asks it: each distinct end once, in the order first asked, up to the first
    that may)."""
    if loads.cluster.nics_per_host < 2 or not roots.size:
        return True
    keys = np.empty(2 * len(roots), dtype=np.int64)
    keys[0::2], keys[1::2] = 2 * roots, 2 * recvs + 1
    _, first = np.unique(keys, return_index=True)
    may = loads.may_relay_end
    return not any(may(NIC_IN if k & 1 else NIC_OUT, k >> 1)
                   for k in keys[np.sort(first)].tolist())


def plan_sends(run: Sequence[tuple[Cell, int, int, int]], loads: Loads
               ) -> list[list[Task]] | None:
    """Each cell's tasks (:func:`~reshard.planner.cells.cell_tasks.plan_broadcast`'s:
    one send) where every cell of ``run`` is point to point (:func:`ends`), none
    between hosts may relay, and the sums are of whole bytes (see the module); else
    None, having charged nothing."""
    got = ends(cell for cell, _, _, _ in run)
    if got is None:
        return None
    roots, recvs = got
    nb = np.array([cell.size * itemsize for cell, _, itemsize, _ in run], dtype=np.int64)
    if int(nb.min(initial=0)) < 0 or int(nb.sum()) >= EXACT:
        return None
    host, nic = loads.host, loads.nic
    root_arr, recv_arr = np.array(roots, dtype=np.int64), np.array(recvs, dtype=np.int64)
    cross = np.array(list(map(host, roots))) != np.array(list(map(host, recvs)))
    x_roots, x_recvs = root_arr[cross], recv_arr[cross]
    if not _no_relay(loads, x_roots, x_recvs):
        return None
    x_nb = nb[cross]
    writes = [(loads.dev_out, *_sums(root_arr, nb)), (loads.dev_in, *_sums(recv_arr, nb))]
    if x_roots.size:
        for table, devs in ((loads.nic_out, x_roots), (loads.nic_in, x_recvs)):
            nics = np.fromiter(map(nic, devs.tolist()), dtype=np.int64, count=len(devs))
            writes.append((table, *_sums(nics, x_nb)))
    if not all(stays_whole(*w) for w in writes):
        return None
    for w in writes:
        _add(*w)
    send = TaskKind.SEND
    return [[new_task(send, tensor, cell.box, a, (b,), n, step)]
            for (cell, tensor, _, step), a, b, n in zip(run, roots, recvs, nb.tolist())]


def expect_sends(loads: Loads, cells: Sequence[Cell], nbytes: Sequence[int]) -> bool:
    """``loads.expect(cell.holders, cell.needers, nb)`` of each cell in turn, where
    every cell is point to point (:func:`ends`) and the sums are of whole bytes (see
    the module); else False, having changed nothing."""
    got = ends(iter(cells))
    if got is None:
        return False
    nb = np.array(nbytes, dtype=np.int64)
    total = int(nb.sum())
    if int(nb.min(initial=0)) < 0 or total >= EXACT:
        return False
    roots, recvs = got
    host = loads.host
    cross = np.array(list(map(host, roots))) != np.array(list(map(host, recvs)))
    nic = loads.nic
    keys = np.empty(2 * int(cross.sum()), dtype=np.int64)  # as cell by cell writes them
    keys[0::2] = [2 * nic(a) for a, c in zip(roots, cross.tolist()) if c]
    keys[1::2] = [2 * nic(b) + 1 for b, c in zip(recvs, cross.tolist()) if c]
    codes, sums = _sums(keys, np.repeat(nb[cross], 2))
    named = [(NIC_IN if k & 1 else NIC_OUT, k >> 1) for k in codes]
    expected = loads.expected
    if not stays_whole(expected, named, sums):
        return False
    has_shared = bool(loads.cluster.shared_bandwidth)
    if has_shared and not (loads.shared >= 0 and float(loads.shared).is_integer() and
                           loads.shared + total < EXACT):
        return False
    _add(expected, named, sums)
    if has_shared:
        loads.shared += total
    loads.expected_changed(len(cells))
    return True


__all__ = ["ends", "expect_sends", "is_send", "plan_sends"]

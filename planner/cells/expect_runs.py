"""The expected NIC demand of a run of one-holder slices, summed as whole bytes.

:meth:`Loads.expect` of a slice from one holder that needs nothing of it, to two or
more needers, adds :func:`~reshard.planner.cells.balance.slice_demand`'s amounts to the
expectations, slice after slice. Its amounts read nothing of the holder but its host
(whether a needer host holds it) and its NIC (which names the ``NIC_OUT`` amount, the
first), so they are found once per (needers, bytes, holder's host among theirs). Where every amount
and every expectation it adds to is a whole number of bytes and every total stays below
2**53, each addition of the slice-by-slice sums is exact, so the totals are the same
floats in any order: here each NIC's by one sum (a partial sum's reduced pieces sent to
every destination host: 131,072 slices at 1,024 devices, 8 KiB each)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from reshard.planner.cells.balance import Loads
from reshard.planner.cells.decompose import Cell
from reshard.planner.cells.send_runs import expect_sends, is_send
from reshard.planner.cells.set_codes import first_order, set_codes
from reshard.planner.cells.whole_sums import EXACT, stays_whole
from reshard.planner.values.resources import NIC_OUT

MIN_RUN = 512
"""Slices from which :func:`expect_run` sums them (fewer: slice by slice)."""

Demand = tuple[list[tuple[tuple[str, int], float]], float]
""":func:`~reshard.planner.cells.balance.slice_demand`'s answer: amounts and shared."""


def expect_run(loads: Loads, cells: Sequence[Cell], nbytes: Sequence[int]) -> bool:
    """``loads.expect(cell.holders, cell.needers - cell.holders, nb)`` of each cell of
    ``cells`` (at least :data:`MIN_RUN`) in turn, where each has one holder, not among
    its two or more needers, and the sums are of whole bytes (see the module); else
    False, having changed nothing."""
    if len(cells) < MIN_RUN:
        return False
    if is_send(cells[0]):  # point to point: _kinds declines it
        return expect_sends(loads, cells, nbytes)
    if len(cells[0].holders) > 1:  # _kinds declines it
        return _expect_held(loads, cells, nbytes)
    found = _kinds_bulk(loads, cells, nbytes)
    if found is None:  # declined (or not a run): cell by cell, as before
        found = _kinds(loads, cells, nbytes)
    if found is None:
        return False
    return _sum_kinds(loads, found, len(cells))


def expect_coded(loads: Loads, hcode: np.ndarray, hsets: Sequence[frozenset[int]],
                 ncode: np.ndarray, nsets: Sequence[frozenset[int]], nbytes: Sequence[int]
                 ) -> bool:
    """:func:`expect_run` of the cells whose holders are ``hsets[hcode[i]]`` and
    needers ``nsets[ncode[i]]`` (each numbered as :func:`~reshard.planner.cells.
    set_codes.set_codes` numbers them, the cells' own set objects), read from those
    columns: the same sums where :func:`_kinds_bulk` would answer; else False, having
    changed nothing (the caller asks :func:`expect_run` of the cells)."""
    if len(hcode) < MIN_RUN:
        return False
    found = _coded_kinds(loads, hcode, hsets, ncode, nsets, nbytes,
                         lambda c: (hsets[hcode[c]], nsets[ncode[c]]))
    return found is not None and _sum_kinds(loads, found, len(hcode))


def _sum_kinds(loads: Loads, found: tuple[list[Demand], np.ndarray, np.ndarray],
               slices: int) -> bool:
    """:func:`expect_run`'s sums of the kinds ``found`` of ``slices`` cells (see the
    module)."""
    kinds, kind_of, out_nic = found
    counts = np.bincount(kind_of, minlength=len(kinds)).tolist()
    totals: dict[tuple[str, int], int] = {}
    shared = 0
    outs = []
    for (amounts, share), count in zip(kinds, counts):
        if any(not (a >= 0 and float(a).is_integer()) for _, a in amounts) or \
                not (share >= 0 and float(share).is_integer()):
            return False
        outs.append(int(amounts[0][1]) if amounts else 0)
        for key, a in amounts[1:]:
            totals[key] = totals.get(key, 0) + int(a) * count
        shared += int(share) * count
    per_nic = np.bincount(out_nic, weights=np.array(outs, dtype=np.float64)[kind_of])
    sends = np.array([bool(amounts) for amounts, _ in kinds])[kind_of]  # into some host
    # each NIC some cell sends out of, ascending (np.unique's answer: numpy 2.4's
    # hashes, and loads numpy.ma the first time, 10 ms)
    for n in np.flatnonzero(np.bincount(out_nic[sends])).tolist():
        totals[(NIC_OUT, n)] = totals.get((NIC_OUT, n), 0) + int(per_nic[n])
    return _add(loads, totals, shared, slices, sum(outs) * slices)


def _expect_held(loads: Loads, cells: Sequence[Cell], nbytes: Sequence[int]) -> bool:
    """:func:`expect_run` of cells that share one set of two or more holders: each
    adds ``loads.demand(holders, needers - holders, nb)`` (:meth:`Loads.expect` as the
    work list asks it of a slice of several holders), whose ``NIC_OUT`` amounts are
    one amount onto each of the holders' NICs (:meth:`Loads.demand_parts`): each
    NIC's by one sum over the cells, each entry's by one sum per key, where every
    amount is whole (see the module; a replicated source's cells, each to another
    host's device: 1,024 NICs' amounts a cell at 1,024 devices). Else False, having
    changed nothing."""
    holders = cells[0].holders
    if any(c.holders is not holders and c.holders != holders for c in cells):
        return False
    totals: dict[tuple[str, int], int] = {}
    get = totals.get
    leaving = shared = 0
    out: tuple[int, ...] = ()
    for cell, nb in zip(cells, nbytes):
        needers = cell.needers - holders
        shared += nb * len(needers)
        out, into, entries = loads.demand_parts(holders, needers, nb)
        if not into:
            continue
        each = nb * into / len(out)  # slice_demand's amount, the same float
        if not (each >= 0 and float(each).is_integer()):
            return False
        leaving += int(each)
        for key, a in entries:
            if not (a >= 0 and float(a).is_integer()):
                return False
            totals[key] = get(key, 0) + int(a)
    if leaving:
        for n in out:
            totals[(NIC_OUT, n)] = leaving
    return _add(loads, totals, shared, len(cells), leaving)


def _kinds_bulk(loads: Loads, cells: Sequence[Cell], nbytes: Sequence[int]
                ) -> tuple[list[Demand], np.ndarray, np.ndarray] | None:
    """:func:`_kinds`' answer found with arrays: the cells' holder and needer sets and
    bytes numbered (:func:`set_codes`), the holders checked against their needers with
    membership tables (:func:`_at_host`), the kinds numbered in the order they first occur and each kind's demand asked
    of its first cell, as cell by cell. None where :func:`_kinds` would answer None or
    the bytes are not int64 (then :func:`_kinds` answers)."""
    hcode, hsets = set_codes([c.holders for c in cells])
    ncode, nsets = set_codes([c.needers for c in cells])
    return _coded_kinds(loads, hcode, hsets, ncode, nsets, nbytes,
                        lambda c: (cells[c].holders, cells[c].needers))


def _coded_kinds(loads: Loads, hcode: np.ndarray, hsets: Sequence[frozenset[int]],
                 ncode: np.ndarray, nsets: Sequence[frozenset[int]], nbytes: Sequence[int],
                 sets_of: Callable[[int], tuple[frozenset[int], frozenset[int]]]
                 ) -> tuple[list[Demand], np.ndarray, np.ndarray] | None:
    """:func:`_kinds_bulk` of cells numbered already (``sets_of(c)``: cell ``c``'s
    holders and needers, whose demand a kind asks of its first cell)."""
    if any(len(s) != 1 for s in hsets) or any(len(s) < 2 for s in nsets):
        return None
    nb = np.array(nbytes)
    if nb.dtype != np.int64 or nb.shape != (len(hcode),):
        return None
    host, nic = loads.host, loads.nic
    roots = [next(iter(s)) for s in hsets]
    at = _at_host(hcode, ncode, roots, nsets, host)
    if at is None:
        return None
    found = _kind_order(ncode, len(nsets), nb, at)
    if found is None:
        return None
    kind, first = found
    kinds = [loads.demand(*sets_of(c), nbytes[c]) for c in first.tolist()]
    out_nic = np.array([nic(h) for h in roots], dtype=np.int64)[hcode]
    return kinds, kind, out_nic


DENSE_KINDS = 1 << 20
"""Kind codes (needer sets x sizes x hosts) up to which, or up to four per cell,
:func:`_kind_order` numbers them by a table of first places rather than by a sort."""


def _kind_order(ncode: np.ndarray, nsets: int, nb: np.ndarray, at: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`~reshard.planner.cells.set_codes.first_order` of each cell's (needer
    set, bytes, holder's host or -1) key: every cell's kind, numbered in the order
    kinds first occur, and each kind's first cell. The key is coded one-to-one (the
    bytes by their rank among the distinct bytes, none where all are equal; the host
    shifted by one), so which cells share a kind, and the order kinds first occur,
    are those of any one-to-one coding (the keys' first-order numbering reads only
    which cells are equal). Few codes (:data:`DENSE_KINDS`): each code's first cell
    is the least of its cells (``np.minimum.at``), the kinds ranked by it: the same
    numbers as ``first_order``'s sort. None where the codes would not fit an int64."""
    if nb.min() == nb.max():
        sizes, nsizes = np.zeros(len(nb), dtype=np.int64), 1
    else:
        distinct, sizes = np.unique(nb, return_inverse=True)
        nsizes = len(distinct)
    span = int(at.max()) + 2  # hosts from -1 (no needer on the holder's host)
    bound = nsets * nsizes * span
    if bound >= 2 ** 62:
        return None
    codes = (ncode * nsizes + sizes.reshape(-1)) * span + (at + 1)
    n = len(codes)
    if bound > max(DENSE_KINDS, 4 * n):
        return first_order(codes)
    first = np.full(bound, n, dtype=np.int64)
    np.minimum.at(first, codes, np.arange(n, dtype=np.int64))
    used = np.flatnonzero(first < n)
    order = used[np.argsort(first[used], kind="stable")]
    rank = np.empty(bound, dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return rank[codes], first[order]


def _at_host(hcode: np.ndarray, ncode: np.ndarray, roots: list[int],
             nsets: Sequence[frozenset[int]], host: Callable[[int], int]) -> np.ndarray | None:
    """Each cell's holder's host where some needer of it is there, else -1 (as
    :func:`_kinds` keys them); None where a holder is among its needers or the
    membership tables would be large."""
    devices = max(max(roots), *(max(s) for s in nsets)) + 1
    if len(nsets) * devices >= 2 ** 24 or min(roots) < 0 or \
            min(min(s) for s in nsets) < 0:
        return None
    member = np.zeros((len(nsets), devices), dtype=bool)  # needer set x device
    root = np.array(roots, dtype=np.int64)[hcode]
    for i, needers in enumerate(nsets):
        member[i, list(needers)] = True
    if member[ncode, root].any():
        return None
    names, root_host = np.unique([host(r) for r in roots], return_inverse=True)
    of_host = {h: i for i, h in enumerate(names.tolist())}
    there = np.zeros((len(nsets), len(names)), dtype=bool)  # needer set x holder host
    for i, needers in enumerate(nsets):
        there[i, [of_host[h] for h in set(map(host, needers)) if h in of_host]] = True
    cell_host = root_host.reshape(-1)[hcode]
    return np.where(there[ncode, cell_host], names[cell_host], -1)


def _kinds(loads: Loads, cells: Sequence[Cell], nbytes: Sequence[int]
           ) -> tuple[list[Demand], np.ndarray, np.ndarray] | None:
    """Each distinct (needers, bytes, holder's host if some needer is there)'s demand,
    each cell's and each cell's holder's NIC; None where some cell has not one holder
    outside two or more needers. (:func:`~reshard.planner.cells.balance.slice_demand`
    reads the holder's host only to leave out a needer host that holds the slice.)"""
    host, nic = loads.host, loads.nic
    index: dict[tuple[frozenset[int], int, int], int] = {}
    hosts_of: dict[frozenset[int], frozenset[int]] = {}
    kinds: list[Demand] = []
    kind_of: list[int] = []
    out_nic: list[int] = []
    for cell, nb in zip(cells, nbytes):
        holders, needers = cell.holders, cell.needers
        if len(holders) != 1 or len(needers) < 2 or not holders.isdisjoint(needers):
            return None
        (h,) = holders
        hosts = hosts_of.get(needers)
        if hosts is None:
            hosts = hosts_of[needers] = frozenset(map(host, needers))
        key = (needers, nb, host(h) if host(h) in hosts else -1)
        k = index.get(key)
        if k is None:
            k = index[key] = len(kinds)
            kinds.append(loads.demand(holders, needers, nb))
        kind_of.append(k)
        out_nic.append(nic(h))
    return kinds, np.array(kind_of, dtype=np.int64), np.array(out_nic, dtype=np.int64)


def _add(loads: Loads, totals: dict[tuple[str, int], int], shared: int, slices: int,
         bound: int) -> bool:
    """Add ``totals`` to the expectations and ``shared`` to the shared total (on a
    cluster with shared bandwidth), as ``slices`` writers, where every expectation
    touched is a whole number and every sum stays below :data:`EXACT` (``bound``: the
    ``NIC_OUT`` amounts' sum over every slice, a bound on any one NIC's); else False."""
    expected = loads.expected
    if bound >= EXACT or shared >= EXACT:
        return False
    if not stays_whole(expected, totals.keys(), totals.values()):
        return False
    has_shared = bool(loads.cluster.shared_bandwidth)
    if has_shared and not (loads.shared >= 0 and float(loads.shared).is_integer() and
                           loads.shared + shared < EXACT):
        return False
    for key, total in totals.items():
        expected[key] += total
    if has_shared:
        loads.shared += shared
    loads.expected_changed(slices)
    return True


__all__ = ["MIN_RUN", "expect_coded", "expect_run"]

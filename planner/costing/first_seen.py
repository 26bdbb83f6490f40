"""Resource codes numbered in the order they first appear: the fair-share set-up's
resources (:class:`~reshard.planner.costing.fairshare.FairShare`), each numbered by its
first edge, so that the numbers, and every array by resource, do not depend on the
codes' range."""

from __future__ import annotations

import numpy as np

PREFIX, SAMPLE, FEW = 4, 64, 16
""":func:`numbered` numbers ``PREFIX`` codes per value of their range first (of more
than twice as many: the rest looked up), unless one in more than ``FEW`` of every
``SAMPLE``-th code after them lacks a number there."""

BLOCK = 1 << 18
""":func:`_numbered_all` finds first places this many codes at a time (no index of
every code laid out)."""


def numbered(codes: np.ndarray, reuse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``codes`` (non-negative) in the order they first appear, and each
    code's number in that order (:func:`_numbered_all`). Many codes over a range far
    smaller: those of a prefix numbered first (:data:`PREFIX` times the range), then
    every code looked up in that table; only the codes it lacks (all after the prefix,
    so numbered after its codes, in their own order of first appearance) are numbered
    apart: the same numbers, without a first-appearance pass over every code. Where a
    sample (every :data:`SAMPLE`-th code after the prefix) finds more than one in
    :data:`FEW` of them lacking, the table of them all, as before. ``reuse``: the
    caller's ``codes`` (``intp``, its own, read no more) may hold the numbers, looked
    up in place (:func:`_looked_up_in`: no second array of every edge)."""
    bound = int(codes.max(initial=-1)) + 1
    head = PREFIX * bound
    if len(codes) <= 2 * head:
        return _numbered_all(codes, bound)
    in_order, _ = _numbered_all(codes[:head], bound)
    table = np.arange(-1, -1 - bound, -1, dtype=np.int64)  # a code it lacks: -1 - code
    table[in_order] = np.arange(len(in_order), dtype=np.int64)
    if np.count_nonzero(table[codes[head::SAMPLE]] < 0) * FEW > len(codes) // SAMPLE:
        return _numbered_all(codes, bound)  # many codes lack one: a table of them all
    out: np.ndarray = _looked_up_in(table, codes) if reuse and len(codes) >= BLOCK and \
        codes.dtype == np.intp and codes.flags.writeable else table[codes]
    new = np.flatnonzero(out < 0)
    if not len(new):
        return in_order, out
    more, numbers = _numbered_all(-1 - out[new], bound)  # the codes lacking, as they were
    out[new] = numbers + len(in_order)
    return np.concatenate((in_order, more)), out


def _looked_up_in(table: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``table[codes]`` written over ``codes`` (:data:`BLOCK` at a time), which it
    returns. ``np.take`` with ``mode="clip"`` writes ``out=`` directly (no copy of it;
    every code is below ``len(table)``, so nothing is clipped), reading each code
    before it writes that place."""
    for a in range(0, len(codes), BLOCK):
        part = codes[a:a + BLOCK]
        np.take(table, part, out=part, mode="clip")
    return codes


def _numbered_all(codes: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`numbered` of codes below ``bound``: by a table over the codes' range
    where it is not far larger than the codes (linear; the sort of ``np.unique`` where
    it is). Each first place is the least of the code's places, found :data:`BLOCK`
    codes at a time (the same least)."""
    n = len(codes)
    if bound > 4 * n + 4096:
        used, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
        order = np.argsort(first)  # distinct first places: no ties
        number = np.empty(len(used), dtype=np.int64)
        number[order] = np.arange(len(used))
        return used[order], number[inverse.reshape(-1)]
    first = np.full(bound, n, dtype=np.int64)
    for a in range(0, n, BLOCK):
        b = min(a + BLOCK, n)
        np.minimum.at(first, codes[a:b], np.arange(a, b, dtype=np.int64))
    used = np.flatnonzero(first < n)
    in_order = used[np.argsort(first[used])]  # distinct first places: no ties
    # numbers stay int64 (intp): bincount, the set-up's main reader, would copy int32
    # ones into intp each call
    number = np.empty(bound, dtype=np.int64)
    number[in_order] = np.arange(len(in_order), dtype=np.int64)
    return in_order, number[codes]


__all__ = ["BLOCK", "FEW", "PREFIX", "SAMPLE", "numbered"]

"""Chains as rows of devices: which may be laid out as arrays, and their codes (issue
62, round twelve).

:mod:`~reshard.planner.costing.chain_columns` lays out a run of chains (a broadcast's
``root -> receivers[0] -> ...``, a reduction's ``receivers[0] -> ... -> root``), each a
row of its devices in chain order: 131,072 rows of 9 for a partial source's kept
broadcasts at 1,024 devices, 1,024 rows of 1,024 for its reductions. :func:`priced`
says which rows are laid out (every device on the cluster, none twice), by whole-array
bounds where every row is on the cluster and by the width's cheapest test of distinct
devices (:func:`distinct_rows`); :func:`codes` writes every row's route codes, each
edge's link out and link in and, where it changes host, both NICs, by writing every
edge's two link codes in place and the few crossings' NIC codes after them, not by
picking four candidate codes an edge out of a mask.
"""

from __future__ import annotations

import numpy as np

from reshard.planner.values.resources import DEV_IN, DEV_OUT, KIND_CODE, NIC_IN, NIC_OUT

PAIRWISE_UP_TO = 12
"""Row widths up to which distinct devices are found by comparing every pair of
columns (fewer comparisons than a row sort's work; wider: a table or a sort)."""

TABLE_UP_TO = 1 << 24
"""Rows times devices up to which distinct devices are found by marking each row's
devices in a table of flags (more: by sorting each row)."""


def priced(rows: np.ndarray, host: np.ndarray) -> np.ndarray:
    """Which ``rows`` (each a chain's devices) are laid out as arrays: every device on
    the cluster (``host``: each device's, -1 where none), no device twice."""
    n = len(rows)
    if n and int(rows.min()) >= 0 and int(rows.max()) < len(host):
        on = host[rows] >= 0
        keep: np.ndarray = np.ones(n, dtype=bool) if on.all() else on.all(axis=1)
        keep &= distinct_rows(rows, len(host))
        return keep
    keep = np.asarray((rows < len(host)).all(axis=1) & (rows >= 0).all(axis=1))
    keep[keep] = (host[rows[keep]] >= 0).all(axis=1)
    keep &= _sorted_distinct(rows)
    return keep


def distinct_rows(rows: np.ndarray, size: int) -> np.ndarray:
    """Whether each row's devices (each in ``0 .. size - 1``) are distinct: column
    pairs for narrow rows, a table of flags for wide ones where it is small enough,
    else each row sorted."""
    n, width = rows.shape
    if width <= PAIRWISE_UP_TO:
        cols = np.ascontiguousarray(rows.T)
        ok = np.ones(n, dtype=bool)
        differ = np.empty(n, dtype=bool)
        for i in range(1, width):
            for j in range(i):
                np.not_equal(cols[i], cols[j], out=differ)
                ok &= differ
        return ok
    if n * size <= TABLE_UP_TO:
        seen = np.zeros(n * size, dtype=bool)
        seen[rows + (np.arange(n, dtype=np.int64) * size)[:, None]] = True
        counts: np.ndarray = np.count_nonzero(seen.reshape(n, size), axis=1)
        return np.asarray(counts == width)
    return _sorted_distinct(rows)


def _sorted_distinct(rows: np.ndarray) -> np.ndarray:
    """Whether each row's values are distinct, by sorting each row."""
    ordered = np.sort(rows, axis=1)
    return np.asarray((ordered[:, 1:] != ordered[:, :-1]).all(axis=1))


def codes(rows: np.ndarray, host: np.ndarray, nic: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each chain's (``rows``: its devices in chain order, each on the cluster) code
    count, all their codes, row by row (per edge: its sender's link out, its
    receiver's link in, then, where it changes host, the sender's NIC out and the
    receiver's NIC in), and each edge's crossing of hosts."""
    n, width = rows.shape
    m = width - 1
    at_host = host[rows]
    cross = at_host[:, :-1] != at_host[:, 1:]
    crossing = np.flatnonzero(cross)  # edge i of row r is edge r * m + i
    sender = crossing + crossing // m  # its sender's place in the rows, read flat
    flat = rows.reshape(-1)
    links = np.empty((n, m, 2), dtype=np.int64)
    np.multiply(rows[:, :-1], 8, out=links[:, :, 0])
    links[:, :, 0] += KIND_CODE[DEV_OUT]
    np.multiply(rows[:, 1:], 8, out=links[:, :, 1])
    links[:, :, 1] += KIND_CODE[DEV_IN]
    # a crossing edge's NIC codes follow its link codes: 2 codes an edge up to it and
    # 2 more for each crossing before it
    nics = 2 * (crossing + 1) + 2 * np.arange(len(crossing), dtype=np.int64)
    out = np.empty(2 * n * m + 2 * len(crossing), dtype=np.int64)
    placed = np.ones(len(out), dtype=bool)
    placed[nics] = placed[nics + 1] = False
    out[placed] = links.reshape(-1)
    out[nics] = nic[flat[sender]] * 8 + KIND_CODE[NIC_OUT]
    out[nics + 1] = nic[flat[sender + 1]] * 8 + KIND_CODE[NIC_IN]
    lens = 2 * m + 2 * np.bincount(crossing // m, minlength=n)
    return lens, out, cross


__all__ = ["PAIRWISE_UP_TO", "TABLE_UP_TO", "codes", "distinct_rows", "priced"]

"""Sets of devices numbered by value, in the order they first occur: a run's cells'
holders or needers as one integer column.

Cells built from a :class:`~reshard.planner.cells.decompose.CellTable` share its set
objects (131,072 cells at 1,024 devices, a few hundred distinct sets), so the objects
are told apart by identity with numpy first and only the distinct ones are compared by
value (equal sets in distinct objects get one number)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def set_codes(sets: Sequence[frozenset[int]]) -> tuple[np.ndarray, list[frozenset[int]]]:
    """Each of ``sets``' number and the distinct sets: ``codes[i]`` indexes the second;
    the distinct sets in the order their value first occurs in ``sets``."""
    n = len(sets)
    ids = np.fromiter(map(id, sets), dtype=np.uint64, count=n)
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    number: dict[frozenset[int], int] = {}
    of_object = np.empty(len(first), dtype=np.int64)
    for u in np.argsort(first, kind="stable").tolist():  # objects as they first occur
        s = sets[int(first[u])]
        of_object[u] = number.setdefault(s, len(number))
    return of_object[inverse.reshape(-1)], list(number)


def first_order(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct value of ``codes`` numbered in the order it first occurs: every
    entry's number, and each number's first entry."""
    _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(first), dtype=np.int64)
    rank[order] = np.arange(len(first))
    return rank[inverse.reshape(-1)], first[order]


__all__ = ["first_order", "set_codes"]

"""Many paths' edges joined into one array of resource codes and one of fractions.

A plan of a few hundred tasks has about as many distinct paths, most of them a
transfer's hops known by their codes alone (every fraction 1.0, :attr:`~reshard.
planner.costing.fairshare.Path.codes`). Turning each into two small arrays and joining
those costs a few numpy calls per path; :func:`joined` instead extends one Python list
with the codes of each run of such paths (one array per run), and reads the arrays of
the others as they are: the same codes, in the same order, so the same set-up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import numpy as np

Arrays = tuple[np.ndarray, np.ndarray]
"""A path's resource codes and fractions."""

P = TypeVar("P")

Piece = tuple[int, "np.ndarray | None"]
"""A run of edges' count and fractions (None: every one 1.0, known unread)."""


def joined(paths: Iterable[P], codes_of: Callable[[P], Sequence[int] | None],
           arrays_of: Callable[[P], Arrays]) -> tuple[np.ndarray, list[Piece],
                                                           np.ndarray]:
    """The codes of every edge of ``paths``, path by path; their fractions as pieces
    (:data:`Piece`, for :func:`fractions`); and each path's count of edges.

    ``codes_of(p)``: the codes of a path whose fractions are all 1.0 and has no arrays
    yet (None for any other path); ``arrays_of(p)``: the codes and fractions of the
    others (:func:`~reshard.planner.costing.fairshare.path_arrays`)."""
    code_pieces: list[np.ndarray] = []
    pieces: list[Piece] = []
    lens: list[int] = []
    run: list[int] = []  # codes of the present run of paths known by codes alone
    for p in paths:
        codes = codes_of(p)
        if codes is not None:
            run.extend(codes)
            lens.append(len(codes))
            continue
        if run:
            code_pieces.append(np.array(run, dtype=np.int64))
            pieces.append((len(run), None))
            run = []
        c, f = arrays_of(p)
        code_pieces.append(c)
        pieces.append((len(c), f))
        lens.append(len(c))
    if run:
        code_pieces.append(np.array(run, dtype=np.int64))
        pieces.append((len(run), None))
    codes_all = np.concatenate(code_pieces) if code_pieces else np.zeros(0, dtype=np.int64)
    return codes_all, pieces, np.array(lens, dtype=np.int64)


def fractions(pieces: list[Piece], read_from: int) -> np.ndarray | None:
    """The fractions of :func:`joined`'s ``pieces`` as one array, or None where every
    one is 1.0: known so for pieces of paths known by codes alone, and read (each
    distinct array once: paths of one route form share theirs) where there are
    ``read_from`` edges or more (fewer: the caller reads the joined array)."""
    arrays = [f for _, f in pieces if f is not None]
    if not arrays:
        return None
    if sum(n for n, _ in pieces) >= read_from and \
            all(bool((f == 1.0).all()) for f in {id(f): f for f in arrays}.values()):
        return None
    return np.concatenate([np.ones(n) if f is None else f for n, f in pieces])


__all__ = ["Arrays", "Piece", "fractions", "joined"]

"""Many paths' edges joined into one array of resource codes and one of fractions.

A plan of a few hundred tasks has about as many distinct paths, most of them a
transfer's hops known by their codes alone (every fraction 1.0, :attr:`~reshard.
planner.costing.fairshare.Path.codes`). Turning each into two small arrays and joining
those costs a few numpy calls per path; :func:`joined` instead extends one Python list
with the codes of each run of such paths (one array per run), and reads the arrays of
the others as they are: the same codes, in the same order, so the same set-up. A path
whose fractions are known to be 1.0 gives none to read (its piece's fractions are None).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

Arrays = tuple[np.ndarray, "np.ndarray | None"]
"""A path's resource codes and fractions (None: every one 1.0, known unread)."""

P = TypeVar("P")

Piece = tuple[int, "np.ndarray | None"]
"""A run of edges' count and fractions (None: every one 1.0, known unread)."""


def joined(paths: list[P], alone_of: Callable[[list[P]], list[Sequence[int] | None]],
           arrays_of: Callable[[list[P]], list[Arrays]]
           ) -> tuple[np.ndarray, list[Piece], np.ndarray]:
    """The codes of every edge of ``paths``, path by path; their fractions as pieces
    (:data:`Piece`, for :func:`fractions`); and each path's count of edges.

    ``alone_of(paths)``: per path, its codes where its fractions are all 1.0 and it has
    no arrays yet (None for any other path); ``arrays_of(ps)``: per path of ``ps`` its
    codes and fractions (:func:`~reshard.planner.costing.fairshare.path_arrays`; None
    for fractions known to be 1.0), asked of the others. Where every
    path is of one sort the codes join in one call (:func:`_all_alone`,
    :func:`_all_arrays`), else run by run (:func:`_mixed`): the same arrays."""
    alone = alone_of(paths)
    if None not in alone:
        return _all_alone(alone)  # type: ignore[arg-type]
    if alone.count(None) == len(alone):  # no path known by its codes alone
        return _all_arrays(paths, arrays_of)
    return _mixed(paths, alone, arrays_of)


def _all_alone(alone: list[Sequence[int]]) -> tuple[np.ndarray, list[Piece], np.ndarray]:
    """:func:`joined` of paths every one known by its codes alone: one run of them."""
    lens = np.fromiter(map(len, alone), dtype=np.int64, count=len(alone))
    total = int(lens.sum())
    codes = np.fromiter(itertools.chain.from_iterable(alone), dtype=np.int64, count=total)
    return codes, ([(total, None)] if total else []), lens


def _all_arrays(paths: list[P], arrays_of: Callable[[list[P]], list[Arrays]]
                ) -> tuple[np.ndarray, list[Piece], np.ndarray]:
    """:func:`joined` of paths none of which is known by its codes alone: each path's
    arrays as they are (one piece where every fraction is known to be 1.0)."""
    arrays = arrays_of(paths)
    if not arrays:
        return np.zeros(0, dtype=np.int64), [], np.zeros(0, dtype=np.int64)
    codes_of, fracs = zip(*arrays)
    lens = np.fromiter(map(len, codes_of), dtype=np.int64, count=len(arrays))
    codes = np.concatenate(codes_of)
    if all(map(operator.is_, fracs, itertools.repeat(None))):  # one run of ones
        return codes, ([(len(codes), None)] if len(codes) else []), lens
    return codes, list(zip(lens.tolist(), fracs)), lens


def _mixed(paths: list[P], alone: list[Sequence[int] | None],
           arrays_of: Callable[[list[P]], list[Arrays]]
           ) -> tuple[np.ndarray, list[Piece], np.ndarray]:
    """:func:`joined` path by path: the codes of each run of paths known by their
    codes alone as one array, each other path's arrays as they are."""
    code_pieces: list[np.ndarray] = []
    pieces: list[Piece] = []
    lens: list[int] = []
    run: list[int] = []  # codes of the present run of paths known by codes alone
    others = iter(arrays_of([p for p, codes in zip(paths, alone) if codes is None]))
    for codes in alone:
        if codes is not None:
            run.extend(codes)
            lens.append(len(codes))
            continue
        if run:
            code_pieces.append(np.array(run, dtype=np.int64))
            pieces.append((len(run), None))
            run = []
        c, f = next(others)
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

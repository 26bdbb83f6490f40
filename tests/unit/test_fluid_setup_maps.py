"""The fair shares' set-up from paths of issue 62 round fourteen, against the code it
replaces (kept here as the oracle), array for array:

* ``FairShare(paths)`` finds each distinct path and every path's number among them by
  dicts over ``map(id, paths)`` (no Python loop), not ``setdefault`` path by path;
* ``path_join.joined`` joins paths every one known by its codes alone, or none, in one
  call each (``_all_alone``, ``_all_arrays``), and mixed ones run by run as before.

Paths of every sort (codes alone as tuples or lists, empty ones, arrays of ones or of
fractions, plain lists), all distinct or shared, all of one sort or mixed.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard import Cluster
from reshard.planner.costing import path_join
from reshard.planner.costing.fairshare import FairShare, Path, path_arrays, ranges
from reshard.planner.values.resources import KIND_CODE, KINDS


def _old_joined(paths, codes_of, arrays_of):  # type: ignore[no-untyped-def]
    """``joined`` as before: path by path, a call of ``codes_of`` each."""
    code_pieces: list[np.ndarray] = []
    pieces: list = []  # type: ignore[type-arg]
    lens: list[int] = []
    run: list[int] = []
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


def _old_alone(path):  # type: ignore[no-untyped-def]
    if isinstance(path, Path) and path.arrays is None:
        return path.codes
    return None


def _old_setup(paths, cluster):  # type: ignore[no-untyped-def]
    """``FairShare(paths)`` as before: ``setdefault`` path by path, the old join."""
    which: dict[int, int] = {}
    of = np.fromiter((which.setdefault(id(p), len(which)) for p in paths),
                     dtype=np.int64, count=len(paths))
    distinct = {id(p): p for p in paths}
    codes, pieces, dlens = _old_joined(distinct.values(), _old_alone, path_arrays)
    frac = path_join.fractions(pieces, 1 << 15)
    whole = frac is None
    dfrac = np.ones(len(codes)) if frac is None else frac
    out = FairShare.__new__(FairShare)
    if len(distinct) == len(paths):
        out._edges(codes, dfrac, dlens, cluster, whole)
        return out
    dat = np.concatenate([[0], np.cumsum(dlens)])
    lens = dlens[of]
    edges = ranges(dat[of], dat[of] + lens)
    out._edges(codes[edges], dfrac[edges], lens, cluster, whole)
    return out


FORMS = {"alone": (0, 1, 6), "arrays": (2, 3, 4, 5), "mixed": tuple(range(7))}
"""Which forms of path (:func:`_path`) a sort of set-up draws from."""


def _path(rng: random.Random, form: int):  # type: ignore[no-untyped-def]
    k = rng.randint(0, 5)
    res = [(KINDS[rng.randrange(4)], rng.randrange(40)) for _ in range(k)]
    codes = [i * 8 + KIND_CODE[kind] for kind, i in res]
    if form == 0:
        return Path([(r, 1.0) for r in res], tuple(codes))
    if form == 1:
        return Path([(r, 1.0) for r in res], list(codes))
    if form == 2:
        return Path.of_codes(np.array(codes, dtype=np.int64))
    if form == 3:
        return [(r, rng.choice([1.0, 0.5, 0.0])) for r in res]
    if form == 4:
        return Path([(r, 1.0) for r in res])
    if form == 5:
        return Path([(r, rng.choice([1.0, 0.25])) for r in res])
    return Path([], ())  # codes alone, of no edge


def _paths(seed: int, sort: str, n: int, shared: bool):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    made: list = []  # type: ignore[type-arg]
    for _ in range(n):
        if shared and made and rng.random() < 0.4:
            made.append(rng.choice(made))
        else:
            made.append(_path(rng, rng.choice(FORMS[sort])))
    return made


CASES = [(seed, sort, n, shared) for seed in range(4) for sort in FORMS
         for n, shared in ((0, False), (1, False), (7, True), (60, False), (300, True))]


@pytest.mark.parametrize("seed,sort,n,shared", CASES)
def test_a_set_up_from_paths_is_the_old_one(seed, sort, n, shared):
    cluster = Cluster.preset("dgx-h100", 4)
    got = FairShare(_paths(seed, sort, n, shared), cluster)
    want = _old_setup(_paths(seed, sort, n, shared), cluster)
    for name in ("task", "res", "frac", "capacity", "task_at", "counts", "limited"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.tolist() == b.tolist(), name
        assert a.dtype == b.dtype, name
    assert got.resources == want.resources
    assert (got.whole, got.floor, got.n) == (want.whole, want.floor, want.n)


@pytest.mark.parametrize("seed,sort,n,shared", CASES)
def test_joined_is_the_old_join(seed, sort, n, shared):
    from reshard.planner.costing.fairshare import _alone

    paths = list({id(p): p for p in _paths(seed, sort, n, shared)}.values())
    want = _old_joined(paths, _old_alone, path_arrays)
    got = path_join.joined(paths, _alone, lambda ps: list(map(path_arrays, ps)))
    assert got[0].tolist() == want[0].tolist() and got[0].dtype == want[0].dtype
    assert got[2].tolist() == want[2].tolist() and got[2].dtype == want[2].dtype
    assert [n for n, _ in got[1]] == [n for n, _ in want[1]]
    assert [None if f is None else f.tolist() for _, f in got[1]] == \
        [None if f is None else f.tolist() for _, f in want[1]]

"""The fair shares' set-up reads its paths' attributes by maps in C where every path is
a :class:`~reshard.planner.costing.fairshare.Path` (``fairshare._alone``,
``fairshare._coded``), held to the per-path reading it replaces (kept here as the
oracle): the same codes alone, the same arrays (a Path's: the very objects), the same fractions
known to be 1.0, for paths of every form (codes alone, made from arrays of ones read
only or writable, arrays built by a read, fractions other than 1.0, plain lists), of one
form or mixed, shared or not; and the same set-up and simulation."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from reshard import Cluster
from reshard.planner.costing import fairshare
from reshard.planner.costing.fairshare import FairShare, Path, path_arrays
from reshard.planner.values.resources import KIND_CODE, KINDS


def _old_alone(paths):  # type: ignore[no-untyped-def]
    return [p.codes if isinstance(p, Path) and p.arrays is None else None for p in paths]


def _old_coded(paths):  # type: ignore[no-untyped-def]
    wholes = map(getattr, paths, itertools.repeat("whole"), itertools.repeat(False))
    return [(a[0], None) if w else a for a, w in zip(map(path_arrays, paths), wholes)]


def _path(rng: random.Random, form: int):  # type: ignore[no-untyped-def]
    res = [(KINDS[rng.randrange(4)], rng.randrange(40)) for _ in range(rng.randint(0, 5))]
    codes = [i * 8 + KIND_CODE[kind] for kind, i in res]
    arr = np.array(codes, dtype=np.int64)
    made = {0: lambda: Path([(r, 1.0) for r in res], tuple(codes)),
            1: lambda: Path.of_codes(arr),
            2: lambda: Path.of_codes(arr, fairshare._ones(len(arr))),
            3: lambda: Path.of_codes(arr, np.ones(len(arr))),  # writable: read
            4: lambda: Path([(r, rng.choice([1.0, 0.5])) for r in res]),
            5: lambda: [(r, 1.0) for r in res]}[form]()
    if form == 0 and rng.random() < 0.3:
        path_arrays(made)  # codes alone, whose arrays a read built since
    return made


FORMS = {"arrays": (1, 2, 3), "alone": (0,), "paths": (0, 1, 2, 3, 4), "any": tuple(range(6))}


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("sort", sorted(FORMS))
@pytest.mark.parametrize("n", [0, 1, 40])
def test_attributes_read_by_maps_are_those_read_path_by_path(seed, sort, n):
    rng = random.Random(seed * 31 + n)
    paths = [_path(rng, rng.choice(FORMS[sort])) for _ in range(n)]
    assert fairshare._alone(paths) == _old_alone(paths)
    old = _old_coded(paths)  # builds the arrays of codes alone: read the new one after
    new = fairshare._coded(paths)
    assert len(new) == len(old)
    for path, (c, f), (oc, of) in zip(paths, new, old):
        if isinstance(path, Path):  # its arrays kept on it: the very objects
            assert c is oc and f is of
        else:  # a plain list's arrays are made at each read
            assert np.array_equal(c, oc) and np.array_equal(f, of)


@pytest.mark.parametrize("seed", range(4))
def test_set_ups_of_mixed_paths_are_the_same(seed):
    rng = random.Random(seed)
    cluster = Cluster.regular(8, 4)
    forms = [rng.choice(FORMS["paths"]) for _ in range(80)]
    made = [_path(random.Random(seed * 100 + i), f) for i, f in enumerate(forms)]
    again = [_path(random.Random(seed * 100 + i), f) for i, f in enumerate(forms)]
    shared = made + made[::3]
    got = FairShare(shared, cluster)
    fairshare_alone, fairshare_coded = fairshare._alone, fairshare._coded
    try:
        fairshare._alone, fairshare._coded = _old_alone, _old_coded  # type: ignore[assignment]
        want = FairShare(again + again[::3], cluster)
    finally:
        fairshare._alone, fairshare._coded = fairshare_alone, fairshare_coded
    for name in ("task", "res", "frac", "capacity", "codes", "task_at", "counts"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert got.whole == want.whole

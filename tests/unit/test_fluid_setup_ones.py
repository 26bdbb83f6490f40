"""The fair shares' set-up of issue 62 round fifteen, against the code it replaces:

* a path whose fractions are known to be 1.0 (:attr:`Path.whole`: codes given by its
  maker, ones ``of_codes`` made or was given read only) gives none to join and read
  (``fairshare._coded``): the same set-up as its fractions read, array for array;
* ``FairShare.resources`` is built when first read (``codes``, ``resource(i)``), and
  the capacities come from the codes' kinds: the same as from the resources' names;
* ``fluid.simulate`` reads paths and bytes through ``map``: the same estimate.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard import Cluster
from reshard.planner.costing import fairshare, fluid, path_join
from reshard.planner.costing.fairshare import FairShare, Path, path_arrays
from reshard.planner.values.resources import KIND_CODE, KINDS, capacity, of_code

CLUSTER = Cluster.preset("dgx-h100", 4)


def _read_only_ones(n: int) -> np.ndarray:
    out = np.ones(n)
    out.flags.writeable = False
    return out


def _path(rng: random.Random, form: int):  # type: ignore[no-untyped-def]
    k = rng.randint(0, 5)
    res = [(KINDS[rng.randrange(5)], rng.randrange(40)) for _ in range(k)]
    codes = [i * 8 + KIND_CODE[kind] for kind, i in res]
    arr = np.array(codes, dtype=np.int64)
    makers = [
        lambda: Path([(r, 1.0) for r in res], tuple(codes)),  # codes alone
        lambda: Path.of_codes(arr),  # ones of its own
        lambda: Path.of_codes(arr, _read_only_ones(k)),  # shared ones, read only
        lambda: Path.of_codes(arr, np.ones(k)),  # writable ones: read
        lambda: [(r, rng.choice([1.0, 0.5, 0.0])) for r in res],  # a list
        lambda: Path([(r, rng.choice([1.0, 0.25])) for r in res]),  # fractions
    ]
    return makers[form]()


def _paths(seed: int, forms: tuple[int, ...], n: int, shared: bool):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    made: list = []  # type: ignore[type-arg]
    for _ in range(n):
        if shared and made and rng.random() < 0.4:
            made.append(rng.choice(made))
        else:
            made.append(_path(rng, rng.choice(forms)))
    return made


def _old(monkeypatch, paths):  # type: ignore[no-untyped-def]
    """The set-up with every path's fractions read (no path trusted whole)."""
    with monkeypatch.context() as m:
        m.setattr(fairshare, "_coded", lambda ps: list(map(path_arrays, ps)))
        return FairShare(paths, CLUSTER)


FORMS = {"ones": (0, 1, 2), "trusted": (1, 2), "mixed": tuple(range(6)),
         "read": (3, 4, 5), "writable": (2, 3)}
CASES = [(seed, forms, n, shared) for seed in range(3) for forms in FORMS
         for n, shared in ((0, False), (1, False), (9, True), (80, False), (300, True))]


@pytest.mark.parametrize("seed,forms,n,shared", CASES)
def test_a_set_up_trusting_whole_paths_is_the_one_that_reads_them(monkeypatch, seed, forms,
                                                                   n, shared):
    got = FairShare(_paths(seed, FORMS[forms], n, shared), CLUSTER)
    want = _old(monkeypatch, _paths(seed, FORMS[forms], n, shared))
    for name in ("task", "res", "frac", "capacity", "task_at", "counts", "limited", "codes"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.tolist() == b.tolist(), name
    assert (got.whole, got.floor, got.n, got.nres) == (want.whole, want.floor, want.n,
                                                       want.nres)
    flowing = np.ones(got.n, dtype=bool)
    fa, fb = got.fill(flowing), want.fill(flowing)
    assert fa.rate.tobytes() == fb.rate.tobytes() and fa.level.tobytes() == fb.level.tobytes()


@pytest.mark.parametrize("seed", range(4))
def test_coded_trusts_only_paths_whole_by_their_making(seed):
    paths = _paths(seed, FORMS["mixed"], 120, True)
    for p, (codes, frac) in zip(paths, fairshare._coded(paths), strict=True):
        c, f = path_arrays(p)
        assert codes.tolist() == c.tolist()
        if frac is None:  # trusted: made whole, and every fraction is 1.0
            assert isinstance(p, Path) and p.whole and f.tolist() == [1.0] * len(f)
        else:
            assert not getattr(p, "whole", False) and frac.tolist() == f.tolist()


def test_a_writable_shared_ones_array_is_read():
    ones = np.ones(3)
    paths = [Path.of_codes(np.array([0, 9, 18], dtype=np.int64), ones) for _ in range(4)]
    assert not any(p.whole for p in paths)
    ones[1] = 0.5  # a writer changed the shared fractions: the set-up sees it
    fs = FairShare(paths, CLUSTER)
    assert fs.whole is False and 0.5 in fs.frac.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_resources_are_built_when_read_and_capacities_from_codes(seed):
    fs = FairShare(_paths(seed, FORMS["mixed"], 60, True), CLUSTER)
    assert fs._resources is None
    names = [of_code(c) for c in fs.codes.tolist()]
    assert [fs.resource(i) for i in range(fs.nres)] == names
    assert fs._resources is None  # one name read: the list still unbuilt
    assert fs.resources == names and fs.resources is fs.resources
    want = [capacity(r, CLUSTER) for r in names]
    assert fs.capacity.tolist() == want and fs.capacity.dtype == np.float64


def test_pieces_of_whole_paths_join_as_one_run():
    paths = [Path.of_codes(np.array(c, dtype=np.int64)) for c in ([0, 9], [], [18])]
    codes, pieces, lens = path_join.joined(paths, fairshare._alone, fairshare._coded)
    assert codes.tolist() == [0, 9, 18] and lens.tolist() == [2, 0, 1]
    assert pieces == [(3, None)] and path_join.fractions(pieces, 0) is None
    assert path_join.joined([], fairshare._alone, fairshare._coded)[1] == []


@pytest.mark.parametrize("shape,src,dst", [((3, 1000), "S0R", "RR"), ((8, 8), "RR", "RS1"),
                                           ((6, 5), "S1R", "S0S1"), ((5, 7), "RS0", "S1R")])
def test_simulate_reads_paths_and_bytes_as_before(shape, src, dst):
    import reshard
    from reshard import DeviceMesh, Layout
    from reshard.planner.costing.stepgate import gate_of

    mesh = DeviceMesh((2, 2), devices=[0, 1, 2, 3])
    other = DeviceMesh((2, 2), devices=[2, 3, 4, 5])  # overlapping meshes
    p = reshard.plan(shape, "float32", Layout(mesh, src), Layout(other, dst),
                     cluster=CLUSTER)
    old = fluid._Fluid(FairShare([r for r, _ in p.routes()], p.cluster),
                       np.array([float(t.nbytes) for t in p.tasks]), gate_of(p.tasks),
                       p.latencies()).run()
    assert old == fluid.simulate(p)

"""The fair shares' edges of many transfers found in one pass over every edge (issue 62,
round eleven): :meth:`FairShare.edges_of` flags the transfers and keeps their edges
where they hold a quarter of the edges or more, and :meth:`FairShare.loads` sums every
edge, the others' at rate 0.0, where they hold half. Each is held to the path it
replaces (:func:`ranges` of their edges, and the gathered edges' sums: ``_many``
answering False), bit for bit, on transfers of whole bytes, fractions and unused edges,
in increasing order and not, and through fills and whole simulations."""

from __future__ import annotations

import numpy as np
import pytest

from reshard import Cluster
from reshard.planner.costing import fairshare, fluid
from reshard.planner.costing.fairshare import FairShare, ranges
from reshard.planner.costing.stepgate import OneStep

CLUSTER = Cluster.regular(4, 2, nic_bandwidth=2e9, intra_bandwidth=5e9, copy_bandwidth=8e9,
                          nics_per_host=2)
KINDS = ("nic_out", "nic_in", "dev_out", "dev_in")


@pytest.fixture(autouse=True)
def _large_from_none(monkeypatch):
    """Every set-up here counts as large (fairshare.LARGE: the paths tested are
    the 1,024-device ones' in small)."""
    monkeypatch.setattr(fairshare, "LARGE", 0)


def _paths(seed: int, fractions: tuple[float, ...]) -> list[list[tuple[tuple[str, int], float]]]:
    """Transfers of 0 to 9 distinct resources each (a few of many), fractions drawn from
    ``fractions``."""
    rng = np.random.default_rng(seed)
    every = [(k, i) for k in KINDS for i in range(8)]
    paths = []
    for t in range(int(rng.integers(150, 400))):
        many = 9 if t % 11 == 0 else int(rng.integers(0, 4))
        picked = rng.choice(len(every), size=many, replace=False)
        paths.append([(every[int(i)], float(rng.choice(fractions))) for i in picked])
    return paths


FRACTIONS = [(1.0,), (1.0, 0.0), (1.0, 0.5, 0.75, 0.3), (1.0, 0.0, 0.375, 1 / 3)]


def _subsets(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Transfers many and few, increasing and not (shuffled, repeated), and none."""
    most = np.flatnonzero(rng.random(n) < 0.8)
    return [most, np.flatnonzero(rng.random(n) < 0.4), np.arange(0, n, 2), np.arange(1, n),
            np.arange(n - 3), np.arange(5), rng.permutation(most), np.repeat(most, 2),
            np.zeros(0, dtype=np.int64), np.array([n - 1]), np.arange(n)[::-1]]


@pytest.mark.parametrize("fractions", FRACTIONS)
@pytest.mark.parametrize("seed", range(3))
def test_edges_of_many_transfers_are_their_ranges(fractions, seed):
    fs = FairShare(_paths(seed, fractions), CLUSTER)
    rng = np.random.default_rng(seed + 10)
    flagged = 0
    for which in _subsets(fs.n, rng):
        want = ranges(fs.task_at[which], fs.task_at[which + 1])
        got = fs.edges_of(which)
        assert got.dtype == want.dtype and got.tolist() == want.tolist()
        flagged += fs._many(which, 4)
    assert flagged >= 3  # the flags were read, not only ranges


def _as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """The paths replaced: never many (ranges, and loads of the gathered edges), no
    fractions read path by path."""
    monkeypatch.setattr(FairShare, "_many", lambda self, which, share: False)
    monkeypatch.setattr(fairshare, "LARGE", 1 << 62)


@pytest.mark.parametrize("fractions", FRACTIONS)
@pytest.mark.parametrize("seed", range(3))
def test_loads_of_many_transfers_bit_for_bit(monkeypatch, fractions, seed):
    """Rates of every sort (0, -0.0, inf, nan, tiny, fractional) on many transfers
    and few, in order and not."""
    fs = FairShare(_paths(seed, fractions), CLUSTER)
    rng = np.random.default_rng(seed)
    rate = rng.choice([0.0, -0.0, 1.5e9, 3e8 / 7, np.inf, np.nan, 5e-324, 2.5, 1e17 / 3],
                      size=fs.n)
    subsets = _subsets(fs.n, rng)
    got = [fs.loads(which, rate, rate / 3) for which in subsets]
    assert sum(fs._many(which, 2) for which in subsets) >= 3
    _as_before(monkeypatch)
    for which, mine in zip(subsets, got, strict=True):
        for g, w in zip(mine, fs.loads(which, rate, rate / 3), strict=True):
            assert g.tobytes() == w.tobytes()


@pytest.mark.parametrize("fractions", FRACTIONS)
@pytest.mark.parametrize("seed", range(4))
def test_fills_and_simulations_bit_for_bit(monkeypatch, fractions, seed):
    """A whole fill, a refill after ends (a few transfers kept, the rest filled again),
    and a fluid simulation of the transfers at once (ends and refills of many)."""
    paths = _paths(seed, fractions)
    rng = np.random.default_rng(seed)
    flowing = rng.random(len(paths)) < 0.9
    nbytes = rng.integers(1, 1 << 30, size=len(paths)).astype(np.float64) / 7
    lat = rng.choice([0.0, 1e-6, 3e-6], size=len(paths))

    def run():
        fs = FairShare(paths, CLUSTER)
        first = fs.fill(flowing)
        fewer = flowing & (rng_fixed.random(fs.n) < 0.95)
        below = float(np.min(first.rate[flowing & ~fewer], initial=np.inf))
        usage = fs.load(np.flatnonzero(fewer), first.rate)
        again = fs.fill(fewer, first, below, usage)
        sim = fluid.simulate_arrays(fs, nbytes, OneStep(fs.n), lat)
        return first, again, sim

    rng_fixed = np.random.default_rng(99)
    got = run()
    _as_before(monkeypatch)
    rng_fixed = np.random.default_rng(99)
    want = run()
    for g, w in zip(got[:2], want[:2], strict=True):
        assert g.rate.tobytes() == w.rate.tobytes()
        assert g.level.tobytes() == w.level.tobytes()
    assert got[2] == want[2]


@pytest.mark.parametrize("zeros", [False, True])
def test_set_up_reads_whole_fractions_once(zeros):
    """Fractions all 1.0 (with unused edges of 0.0 among them, or not): every edge
    kept is whole, the floor of demand is 1e-12; else 1e-12 times the largest fraction
    (or 1.0)."""
    paths = _paths(5, (1.0, 0.0) if zeros else (1.0,))
    fs = FairShare(paths, CLUSTER)
    assert fs.whole is True
    assert fs.floor == 1e-12
    assert len(fs.res) == sum(f > 0 for p in paths for _, f in p)
    for scale, floor in ((0.5, 1e-12), (1.5, 1e-12 * 1.5)):
        other = FairShare([[(r, scale * f) for r, f in p] for p in paths], CLUSTER)
        assert other.whole is False
        assert other.floor == floor
        assert other.task.tolist() == fs.task.tolist()
        assert other.res.tolist() == fs.res.tolist()


@pytest.mark.parametrize("repeats", [False, True])
def test_set_up_of_paths_of_codes_as_of_lists(monkeypatch, repeats):
    """Paths made from codes (fractions shared, or each its own) set up as the same
    paths as lists, bit for bit; one fraction other than 1.0 among shared ones is seen
    (its arrays are read, not trusted)."""
    from reshard.planner.costing.fairshare import Path, path_arrays
    lists = _paths(7, (1.0,))
    shared: dict[int, np.ndarray] = {}
    made = []
    for i, p in enumerate(lists):
        codes = path_arrays(p)[0]
        ones = shared.setdefault(len(codes), np.ones(len(codes))) if i % 2 else None
        made.append(Path.of_codes(codes, ones))
    if repeats:  # tasks of one route share its path
        made, lists = made + made[:40], lists + lists[:40]
    a = FairShare(made, CLUSTER)
    _as_before(monkeypatch)
    b = FairShare(lists, CLUSTER)
    assert a.whole is b.whole is True
    assert a.frac.strides == (0,) and b.frac.strides == (8,)  # read once, or joined
    for name in ("task", "res", "frac", "task_at", "counts", "capacity"):
        assert getattr(a, name).tobytes() == np.ascontiguousarray(getattr(b, name)).tobytes()
    assert a.resources == b.resources and a.floor == b.floor
    fa, fb = a.fill(np.ones(a.n, dtype=bool)), b.fill(np.ones(b.n, dtype=bool))
    assert fa.rate.tobytes() == fb.rate.tobytes() and fa.level.tobytes() == fb.level.tobytes()
    odd = next(i for i in range(1, len(made), 2) if len(path_arrays(made[i])[0]) > 1)
    shared[len(path_arrays(made[odd])[0])][0] = 0.5  # one shared array not all ones
    monkeypatch.setattr(fairshare, "LARGE", 0)
    c = FairShare(made, CLUSTER)
    assert c.whole is False
    assert 0.5 in c.frac.tolist()

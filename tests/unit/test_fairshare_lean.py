"""The fair shares without the arrays of every edge at once (issue 62, round eighteen):
at 1,024 devices a plan has four million edges, and each array of them is a fresh
32 MiB (page faults, most of the cold estimate's system time). Each lean path is held
to the one it replaces, bit for bit:

* :meth:`FairShare.edge_sums` (a block of transfers at a time, by ``np.add.at``) to
  ``np.bincount`` of every edge's value;
* the first round's frozen transfers where every edge fills (a ``logical_or`` per
  transfer's range of edges) to the transfers of the edges swept, and whole fillings
  and simulations with it to ones without it;
* :attr:`FairShare.task` made when first read to the one made at set-up;
* fractions not given (:meth:`FairShare.of_edges` of None) to ones laid out;
* ``columns._code_type`` (int32 codes where they fit) and ``_unless_ones``.
"""

from __future__ import annotations

import numpy as np
import pytest

from reshard import Cluster
from reshard.planner.costing import columns, fairshare, fluid, index_sets
from reshard.planner.costing.fairshare import FairShare, _distinct
from reshard.planner.costing.stepgate import OneStep

CLUSTER = Cluster.regular(4, 2, nic_bandwidth=2e9, intra_bandwidth=5e9, copy_bandwidth=8e9,
                          nics_per_host=2)
FRACTIONS = [(1.0,), (1.0, 0.0), (1.0, 0.5, 0.75, 0.3), (1.0, 0.0, 0.375, 1 / 3)]


@pytest.fixture(autouse=True)
def _large_from_none(monkeypatch):
    """Every set-up here counts as large (the 1,024-device paths, in small), and a
    block of :meth:`FairShare.edge_sums` is a few transfers (many blocks)."""
    monkeypatch.setattr(fairshare, "LARGE", 0)
    monkeypatch.setattr(fairshare, "BLOCK", 7)  # edges


def _edges(seed: int, fractions: tuple[float, ...], empty: bool = True
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, fractions and lens of transfers of 0 to 9 edges (``empty``: transfers of
    none at the start, the middle and the end; else every one of 1 or more), on the
    cluster's devices and NICs."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(150, 400))
    lens = rng.integers(0, 5, n)
    lens[::11] = 9
    lens[0] = lens[n // 2] = lens[-1] = 0
    if not empty:
        lens = np.maximum(lens, 1)
    kinds = np.array([0, 1, 2, 3])  # dev_out, dev_in, nic_out, nic_in codes' low bits
    codes = rng.integers(0, 8, int(lens.sum())) * 8 + rng.choice(kinds, int(lens.sum()))
    frac = rng.choice(np.array(fractions), len(codes))
    return codes, frac, lens


def _values(rng: np.random.Generator, n: int) -> np.ndarray:
    """Values of every sort: large and tiny, fractional, zeros."""
    out = rng.random(n) * 10.0 ** rng.integers(-8, 12, n)
    out[rng.random(n) < 0.1] = 0.0
    return out


@pytest.mark.parametrize("fractions", FRACTIONS)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block", [1, 7, 20, 1 << 18])
def test_edge_sums_are_the_bincount_of_every_edge(monkeypatch, fractions, seed, block):
    monkeypatch.setattr(fairshare, "BLOCK", block)
    fs = FairShare.of_edges(*_edges(seed, fractions), CLUSTER)
    values = _values(np.random.default_rng(seed + 5), fs.n)
    on = values[fs.task]
    want = np.bincount(fs.res, weights=on if fs.whole else fs.frac * on, minlength=fs.nres)
    assert fs.edge_sums(values).tolist() == want.tolist()
    flows = fs.loads(np.arange(fs.n), values)[0]
    assert flows.tolist() == want.tolist()  # every transfer: the same sums
    assert fluid._carried(fs, values).tolist() == want.tolist()


@pytest.mark.parametrize("empty", [True, False])
@pytest.mark.parametrize("fractions", FRACTIONS)
@pytest.mark.parametrize("seed", range(4))
def test_first_round_frozen_are_the_transfers_of_the_swept_edges(fractions, seed, empty):
    fs = FairShare.of_edges(*_edges(seed, fractions, empty), CLUSTER)
    if empty or 0.0 not in fractions:  # both paths: transfers of no edge, and none
        assert bool(fs.limited.all()) is not empty
    rng = np.random.default_rng(seed + 9)
    on = fairshare._EdgesOn(None, fs.res, fs.nres)
    for _ in range(20):
        tight = np.flatnonzero(rng.random(fs.nres) < rng.random())
        want = _distinct(fs.task[on.swept(tight)], fs.n)
        got = fs._first_frozen(tight)
        assert got.dtype == want.dtype and got.tolist() == want.tolist()


def _as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first round as before: the transfers of the swept edges."""
    def first(self, tight):
        return _distinct(self.task[fairshare._EdgesOn(None, self.res, self.nres).swept(tight)],
                         self.n)
    monkeypatch.setattr(FairShare, "_first_frozen", first)


@pytest.mark.parametrize("empty", [True, False])
@pytest.mark.parametrize("fractions", FRACTIONS)
@pytest.mark.parametrize("seed", range(4))
def test_fills_and_runs_bit_for_bit(monkeypatch, fractions, seed, empty):
    edges = _edges(seed, fractions, empty)
    rng = np.random.default_rng(seed + 3)
    n = len(edges[2])
    nbytes = rng.integers(1, 1 << 30, n).astype(np.float64)
    lat = rng.random(n) * 1e-5
    flowing = [np.ones(n, dtype=bool), rng.random(n) < 0.5]
    got = [FairShare.of_edges(*edges, CLUSTER).fill(f) for f in flowing]
    run = fluid.simulate_arrays(FairShare.of_edges(*edges, CLUSTER), nbytes, OneStep(n), lat)
    with monkeypatch.context() as m:
        _as_before(m)
        want = [FairShare.of_edges(*edges, CLUSTER).fill(f) for f in flowing]
        before = fluid.simulate_arrays(FairShare.of_edges(*edges, CLUSTER), nbytes,
                                       OneStep(n), lat)
    for g, w in zip(got, want, strict=True):
        assert g.rate.tolist() == w.rate.tolist() and g.level.tolist() == w.level.tolist()
    assert run == before


@pytest.mark.parametrize("seed", range(4))
def test_task_made_when_read_is_the_set_up_one(seed):
    codes, frac, lens = _edges(seed, (1.0, 0.0, 0.5))
    for f in (frac, np.ones(len(codes))):
        fs = FairShare.of_edges(codes, f, lens, CLUSTER)
        want = np.repeat(np.arange(len(lens)), lens)
        if not (f > 0).all():
            want = want[f > 0]
        assert fs.task.dtype == np.int64 and fs.task.tolist() == want.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_fractions_not_given_are_ones(seed):
    codes, _, lens = _edges(seed, (1.0,))
    rng = np.random.default_rng(seed)
    nbytes = rng.integers(1, 1 << 30, len(lens)).astype(np.float64)
    lat = rng.random(len(lens)) * 1e-5
    a = FairShare.of_edges(codes, None, lens, CLUSTER)
    b = FairShare.of_edges(codes, np.ones(len(codes)), lens, CLUSTER)
    assert a.whole and b.whole and a.floor == b.floor
    assert a.frac.tolist() == b.frac.tolist() and a.res.tolist() == b.res.tolist()
    assert fluid.simulate_arrays(a, nbytes, OneStep(len(lens)), lat) == \
        fluid.simulate_arrays(b, nbytes, OneStep(len(lens)), lat)


def test_codes_are_int32_only_where_they_fit():
    small = np.array([5, 9], dtype=np.int64)
    assert columns._code_type(small, 16, np.array([3])) is np.int32
    assert columns._code_type(np.array([1 << 31]), 16, np.array([3])) is np.int64
    assert columns._code_type(small, 1 << 28, np.array([3])) is np.int64
    assert columns._code_type(small, 16, np.array([1 << 28])) is np.int64
    assert columns._code_type(np.zeros(0, dtype=np.int64), 16, np.zeros(0, dtype=np.int64)) \
        is np.int32


def test_unless_ones():
    assert columns._unless_ones(None) is None
    assert columns._unless_ones(np.ones(3)) is None
    some = np.array([1.0, 0.5])
    assert columns._unless_ones(some) is some


@pytest.mark.parametrize("fractions", FRACTIONS)
@pytest.mark.parametrize("seed", range(4))
def test_demand_is_the_bincount_of_the_fractions(fractions, seed):
    """Whole set-ups count each resource's edges (a sum of ones); the others sum their
    fractions, as before."""
    fs = FairShare.of_edges(*_edges(seed, fractions), CLUSTER)
    rng = np.random.default_rng(seed)
    for mine in (np.arange(len(fs.res)), np.flatnonzero(rng.random(len(fs.res)) < 0.3)):
        r, f = fs.res[mine], np.asarray(fs.frac)[mine]
        want = np.bincount(r, weights=f, minlength=fs.nres)
        got = fs._demand(r, f)
        assert got.dtype == want.dtype and got.tolist() == want.tolist()


def test_is_arange_is_the_comparison_with_arange():
    """``is_arange`` (no arange laid out) against ``values == np.arange(n)``, on arange
    itself and near misses: shuffled, a repeat, a gap, shifted, short, long, empty."""
    rng = np.random.default_rng(0)
    n = 50
    every = np.arange(n)
    cases = [every, every[::-1], rng.permutation(n), np.r_[0, every[:-1]],
             np.r_[every[:20], every[21:], n], every + 1, every - 1, every[:-1],
             np.arange(n + 1), np.zeros(0, dtype=np.int64), np.r_[every[:-1], n],
             np.r_[0, 2, every[2:]]]
    for values in cases:
        for m in (n - 1, n, n + 1, 0):
            want = len(values) == m and bool((values == np.arange(m)).all())
            assert index_sets.is_arange(values, m) is want
            fs = FairShare.of_edges(np.zeros(m, dtype=np.int64), None, np.ones(m, dtype=np.int64),
                                    CLUSTER)
            assert fs._every(values) is want  # the same check, written out


def test_ends_of_rows_are_the_gathered_columns():
    """``work._ends`` hands back the columns themselves only where the rows are every
    row in order (checked without an arange): else the gathered rows."""
    from types import SimpleNamespace

    from reshard.planner.schedule import work
    rng = np.random.default_rng(1)
    n = 40
    p2p = SimpleNamespace(root=rng.integers(0, 9, n), recv=rng.integers(0, 9, n))
    every = np.arange(n)
    for rows in (every, every[::-1], rng.permutation(n), np.r_[0, 2, every[2:]],
                 np.r_[every[:-1], n - 2], every[:-1], np.zeros(0, dtype=np.int64)):
        a, b = work._ends(p2p, rows)  # type: ignore[arg-type]
        assert a.tolist() == p2p.root[rows].tolist() and b.tolist() == p2p.recv[rows].tolist()
        assert (a is p2p.root) is (rows is every)

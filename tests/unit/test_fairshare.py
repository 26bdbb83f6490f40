"""The cost model's max-min fair shares and its fluid simulation.

planner/costing/fairshare.py is checked against the definition of max-min fairness itself
(every allocation feasible, every flowing transfer with a full resource on which no
transfer goes faster), its incremental refill against a whole one, and
planner/costing/cost.py's simulation against the simulation as first written
(tests/unit/_reference_cost.py, every event refilling everything): equal on plans of
up to EXACT_UP_TO tasks, and on larger ones (deferred refills) slower by less than 1%.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.costing import cost, fluid
from reshard.planner.costing.fairshare import FairShare

from ..common import problems
from ._reference_cost import reference_simulate

CLUSTER = Cluster.regular(3, 2, nic_bandwidth=2e9, intra_bandwidth=5e9, copy_bandwidth=8e9,
                          nics_per_host=2)
RESOURCES = [("nic_out", i) for i in range(6)] + [("nic_in", i) for i in range(6)] + \
    [("dev_out", d) for d in range(6)] + [("dev_in", d) for d in range(6)] + [("copy", 0)]


@st.composite
def flow_sets(draw):
    """Transfers over some of CLUSTER's resources (fractions 1, or an all-gather's
    (k-1)/k), some crossing none, and which of them flow."""
    n = draw(st.integers(1, 40))
    paths = []
    for _ in range(n):
        used = draw(st.lists(st.sampled_from(RESOURCES), max_size=5, unique=True))
        frac = draw(st.sampled_from([1.0, 0.5, 0.75]))
        paths.append([(r, frac) for r in used])
    flowing = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    return paths, flowing


def check_max_min(fs: FairShare, paths, flowing, rate) -> None:
    """Feasible, and every flowing transfer has a bottleneck: a resource on its path
    that is full and on which no flowing transfer has a higher rate."""
    load: dict = {}
    for t, p in enumerate(paths):
        if flowing[t] and np.isfinite(rate[t]):
            for r, f in p:
                load[r] = load.get(r, 0.0) + f * rate[t]
    cap = dict(zip(fs.resources, fs.capacity))
    for r, used in load.items():
        assert used <= cap[r] * (1 + 1e-9), (r, used, cap[r])
    for t, p in enumerate(paths):
        if not flowing[t]:
            assert rate[t] == 0
            continue
        if not p:
            assert rate[t] == np.inf
            continue
        assert np.isfinite(rate[t]) and rate[t] > 0
        full = [r for r, _ in p if load[r] >= cap[r] * (1 - 1e-9)]
        assert any(all(rate[u] <= rate[t] * (1 + 1e-9) for u, q in enumerate(paths)
                       if flowing[u] and any(r == s for s, _ in q)) for r in full), t


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(case=flow_sets())
def test_fill_is_max_min_fair(case):
    paths, flowing = case
    fs = FairShare(paths, CLUSTER)
    got = fs.fill(flowing)
    check_max_min(fs, paths, flowing, got.rate)
    full = {fs.resources[i] for i in np.flatnonzero(np.isfinite(got.level))}
    for t, p in enumerate(paths):  # a transfer's rate is the lowest level on its path
        levels = [got.level[fs.resources.index(r)] for r, _ in p if r in full]
        if flowing[t] and levels:
            assert got.rate[t] == pytest.approx(min(levels), rel=1e-9)


def _some_end(data, fs, flowing, rate):
    """Some of the flowing transfers drawn to end: the flags after, the least rate of
    those that ended and the resources' usage by the rest (None: nothing flows)."""
    on = np.flatnonzero(flowing)
    if not len(on):
        return None
    ended = np.array(data.draw(st.lists(st.sampled_from(on.tolist()), min_size=1,
                                        unique=True)))
    usage = fs.load(on, rate) - fs.load(ended, rate)
    after = flowing.copy()
    after[ended] = False
    return after, float(rate[ended].min()), usage


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(case=flow_sets(), data=st.data())
def test_refill_after_ends_equals_a_whole_fill(case, data):
    """Transfers end: refilling only those at or above the lowest ended rate gives the
    whole fill's rates and full resources."""
    paths, flowing = case
    fs = FairShare(paths, CLUSTER)
    first = fs.fill(flowing)
    ends = _some_end(data, fs, flowing, first.rate)
    if ends is None:
        return
    after, low, usage = ends
    again = fs.fill(after, first, low, usage)
    whole = fs.fill(after)
    np.testing.assert_allclose(again.rate, whole.rate, rtol=1e-9)
    assert np.array_equal(np.isfinite(again.level), np.isfinite(whole.level))


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(problem=problems(Cluster.regular(4, 2).devices, max_ndim=2, max_size=8),
       strategy=st.sampled_from(["broadcast", "send_recv", "allgather"]))
def test_simulation_equals_the_reference(problem, strategy):
    shape, dtype, src, dst = problem
    cluster = Cluster.preset("dgx-h100", 4, 2)
    p = reshard.plan(shape, dtype, src, dst, cluster=cluster, strategy=strategy)
    got, want = cost.simulate(p), reference_simulate(p)
    assert got.time == pytest.approx(want.time, rel=1e-9, abs=1e-15)
    np.testing.assert_allclose(got.ends, want.ends, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(got.starts, want.starts, rtol=1e-9, atol=1e-15)
    assert got.busiest[:2] == want.busiest[:2]


@pytest.mark.parametrize("case", ["S0R->RS0", "RS01->S01R", "RR+P0->S0R", "steps"])
def test_deferred_refills_err_slow_by_little(monkeypatch, case):
    """Plans over EXACT_UP_TO tasks refill late (fluid.DEFER_TIME): never faster than
    the reference, and slower by under 1% (forced here on plans of a few hundred
    tasks, one step and several)."""
    cluster = Cluster.preset("dgx-h100", 4)
    a, b = DeviceMesh((2, 8), range(16)), DeviceMesh((2, 8), range(16, 32))
    src, dst = {"S0R->RS0": ("S0R", "RS0"), "RS01->S01R": ("RS01", "S01R"),
                "RR+P0->S0R": ("RR+P0", "S0R"), "steps": ("S01R", "RS10")}[case]
    p = reshard.plan((8192, 4096), "bfloat16", Layout(a, src), Layout(b, dst),
                     cluster=cluster, strategy="send_recv",
                     memory_budget=1 << 20 if case == "steps" else None)
    assert len(p.tasks) >= 32
    assert case != "steps" or len({t.step for t in p.tasks}) == 4
    want = reference_simulate(p).time
    monkeypatch.setattr(fluid, "EXACT_UP_TO", 0)
    got = cost.simulate(p).time
    assert want * (1 - 1e-9) <= got <= want * 1.01, (got / want, len(p.tasks))


def _both(fill):
    """``fill()`` on the arrays (SMALL = -1) and on Python floats (SMALL large)."""
    from reshard.planner.costing import fairshare
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fairshare, "SMALL", -1)
        arrays = fill()
        mp.setattr(fairshare, "SMALL", 1 << 30)
        return arrays, fill()


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(case=flow_sets(), data=st.data())
def test_small_fills_equal_the_arrays_bit_for_bit(case, data):
    """A filling of few edges on Python floats (fairshare.SMALL) gives the very rates
    and levels of the array one, whole and after ends."""
    paths, flowing = case
    fs = FairShare(paths, CLUSTER)
    a, b = _both(lambda: fs.fill(flowing))
    assert a.rate.tobytes() == b.rate.tobytes() and a.level.tobytes() == b.level.tobytes()
    ends = _some_end(data, fs, flowing, a.rate)
    if ends is None:
        return
    after, low, usage = ends
    c, d = _both(lambda: fs.fill(after, a, low, usage))
    assert c.rate.tobytes() == d.rate.tobytes() and c.level.tobytes() == d.level.tobytes()


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(spans=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5)), max_size=6))
def test_ranges_is_the_concatenation_of_aranges(spans):
    from reshard.planner.costing.fairshare import ranges
    starts = np.array([a for a, _ in spans], dtype=np.int64)
    stops = np.array([a + n for a, n in spans], dtype=np.int64)
    got = ranges(starts, stops)
    assert got.dtype == np.int64
    assert got.tolist() == [i for a, n in spans for i in range(a, a + n)]


@pytest.mark.parametrize("size,high", [(0, 5), (1, 5), (2, 1), (1000, 7), (5000, 1 << 40)])
def test_sorted_distinct_is_np_unique(size, high):
    from reshard.planner.costing.fairshare import sorted_distinct

    values = np.random.default_rng(size).integers(0, high, size)
    got = sorted_distinct(values)
    want = np.unique(values)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


def _gathered_edges(paths) -> FairShare:
    """FairShare's set-up the long way: each path's edges gathered by its place among
    the distinct paths, the unused edges (fraction 0) dropped by a mask, each transfer's
    range found by a search and ``limited`` by a count."""
    from reshard.planner.costing.fairshare import path_arrays, ranges
    from reshard.planner.costing.first_seen import numbered as _numbered

    which: dict[int, int] = {}
    of = np.array([which.setdefault(id(p), len(which)) for p in paths], dtype=np.int64)
    distinct = [path_arrays(p) for p in {id(p): p for p in paths}.values()]
    dlens = np.array([len(c) for c, _ in distinct], dtype=np.int64)
    dat = np.concatenate([[0], np.cumsum(dlens)])
    edges = ranges(dat[of], dat[of] + dlens[of])
    codes = np.concatenate([c for c, _ in distinct])[edges]
    frac = np.concatenate([f for _, f in distinct])[edges]
    out = FairShare.__new__(FairShare)
    task = np.repeat(np.arange(len(paths), dtype=np.int64), dlens[of])
    used = frac > 0
    out.task, out.res, out.frac = task[used], _numbered(codes)[1][used], frac[used]
    out.task_at = np.searchsorted(out.task, np.arange(len(paths) + 1))
    out.limited = np.bincount(out.task, minlength=len(paths)) > 0
    return out


@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("repeats", [False, True])
def test_set_up_of_distinct_fully_used_paths_as_gathered(zeros, repeats):
    """Paths each its own and every edge used take the set-up's short cuts (the edges as
    given; the ranges from the lengths): the same edges, ranges and flags as gathered,
    masked and searched, with zero fractions and shared path objects or without."""
    rng = np.random.default_rng(int(zeros) * 2 + int(repeats))
    paths = []
    for _ in range(60):
        picked = rng.choice(len(RESOURCES), size=int(rng.integers(0, 6)), replace=False)
        fracs = rng.choice([0.0, 0.5, 1.0] if zeros else [0.5, 1.0], size=len(picked))
        paths.append([(RESOURCES[i], float(f)) for i, f in zip(picked, fracs, strict=True)])
    if repeats:
        paths = [paths[int(i)] for i in rng.integers(0, 20, size=60)]
    got, want = FairShare(paths, CLUSTER), _gathered_edges(paths)
    for name in ("task", "res", "frac", "task_at", "limited"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.tolist() == b.tolist(), name


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(case=flow_sets(), data=st.data())
def test_every_transfer_read_as_the_arrays_themselves_bit_for_bit(case, data):
    """Loads and fills of every transfer read the edge arrays themselves (no ranges or
    gathers): the same bits as through the ranges of every transfer's edges, gathered."""
    paths, _ = case
    fs = FairShare(paths, CLUSTER)
    everyone = np.arange(fs.n)
    flowing = np.ones(fs.n, dtype=bool)
    rate = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.5e9, 3e8, np.inf]),
                                       min_size=fs.n, max_size=fs.n)))
    fast_loads, fast_fill = fs.loads(everyone, rate, 2 * rate), fs.fill(flowing)
    assert fs._every(everyone) and not fs._every(everyone[:-1])
    slow = FairShare(paths, CLUSTER)
    slow._every = lambda which: False  # type: ignore[method-assign]
    slow._all_edges = lambda mine: False  # type: ignore[method-assign]
    slow._all_frozen = lambda active: False  # type: ignore[method-assign]
    for a, b in zip(fast_loads, slow.loads(everyone, rate, 2 * rate), strict=True):
        assert a.tobytes() == b.tobytes()
    whole = slow.fill(flowing)
    assert fast_fill.rate.tobytes() == whole.rate.tobytes()
    assert fast_fill.level.tobytes() == whole.level.tobytes()


def test_every_transfer_frozen_at_once_as_gathered_bit_for_bit():
    """Transfers that all freeze in the first round (one shared bottleneck): the filling
    stops there, with the same rates and levels as one that goes on (taking their load
    off and rounding out the rest) through the ranges of their edges, gathered."""
    paths = [[(("nic_out", 0), 0.5 + (i % 3) / 4), (("dev_in", i % 6), 1.0),
              (("nic_in", i % 6), 0.25 + (i % 2) / 2)] for i in range(70)] + [[]]
    fs, slow = FairShare(paths, CLUSTER), FairShare(paths, CLUSTER)
    slow._every = lambda which: False  # type: ignore[method-assign]
    slow._all_edges = lambda mine: False  # type: ignore[method-assign]
    slow._all_frozen = lambda active: False  # type: ignore[method-assign]
    flowing = np.ones(len(paths), dtype=bool)
    got, want = fs.fill(flowing), slow.fill(flowing)
    assert len(set(got.rate[:-1].tolist())) == 1 and got.rate[-1] == np.inf
    assert got.rate.tobytes() == want.rate.tobytes()
    assert got.level.tobytes() == want.level.tobytes()


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(case=flow_sets())
def test_first_round_swept_as_sorted_bit_for_bit(case):
    """The first round of a filling finds its full resources' edges by one pass over
    every edge (then stops sorting where it froze everything): the same rates and
    levels, bit for bit, as a filling that reads every round from the sorted edges."""
    from reshard.planner.costing import fairshare

    paths, flowing = case
    paths, flowing = paths * 4, np.concatenate([flowing] * 4)  # past SMALL edges
    got = FairShare(paths, CLUSTER).fill(flowing)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fairshare._EdgesOn, "swept", fairshare._EdgesOn.sorted)
        want = FairShare(paths, CLUSTER).fill(flowing)
    assert got.rate.tobytes() == want.rate.tobytes()
    assert got.level.tobytes() == want.level.tobytes()


@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_loads_bit_for_bit_as_each_edge_s_rate(whole, seed):
    """Loads take each transfer's finite rate (else 0) once, then onto its edges, and
    skip the product by fractions that are all 1.0: the same bits as each edge's rate,
    finite or 0, times its fraction (rates inf, nan, -0.0, tiny; every transfer and
    some; paths of whole bytes and of fractions)."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(60):
        hops = [(("nic_out", int(rng.integers(4))), 1.0), (("dev_in", i % 7), 1.0)]
        if not whole and i % 5 == 0:
            hops[0] = (hops[0][0], 0.375 + (i % 3) / 8)
        paths.append(hops)
    fs = FairShare(paths, CLUSTER)
    assert fs.whole is whole
    rate = rng.choice([0.0, -0.0, 1.5e9, 3e8 / 7, np.inf, np.nan, 5e-324, 2.5],
                      size=fs.n)
    for which in (np.arange(fs.n), np.flatnonzero(rng.random(fs.n) < 0.5)):
        got = fs.loads(which, rate, rate / 3)
        mine = np.concatenate([np.arange(fs.task_at[t], fs.task_at[t + 1]) for t in which]
                              ).astype(np.int64)
        for r, g in zip((rate, rate / 3), got, strict=True):
            on = r[fs.task[mine]]
            want = np.bincount(fs.res[mine], weights=fs.frac[mine] * np.where(
                np.isfinite(on), on, 0.0), minlength=len(fs.resources))
            assert g.tobytes() == want.tobytes()


@pytest.mark.parametrize("whole", [True, False])
def test_carried_bytes_bit_for_bit_as_fraction_times_bytes(whole):
    """A simulation's bytes carried per resource skip the product by fractions that are
    all 1.0: the same bits as each edge's fraction times its transfer's bytes."""
    rng = np.random.default_rng(7)
    paths = [[(("nic_out", i % 4), 1.0 if whole or i % 3 else 0.3 + i / 97),
              (("dev_in", i % 5), 1.0)] for i in range(40)]
    fs = FairShare(paths, CLUSTER)
    assert fs.whole is whole
    nbytes = rng.integers(1, 1 << 40, size=fs.n).astype(np.float64) / 3
    want = np.bincount(fs.res, weights=fs.frac * nbytes[fs.task],
                       minlength=len(fs.resources))
    assert fluid._carried(fs, nbytes).tobytes() == want.tobytes()

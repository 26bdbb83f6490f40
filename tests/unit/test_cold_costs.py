"""Cold costs (issue 62): what makes a first answer cheaper keeps it the planner's own.

The ready step of a partial sum's cells (read from the part a cell was cut from)
against every reduced piece it overlaps; a build cut short by a limit against the whole
build; the baselines' floors below every plan their searches could keep; the answers of
a long batch as they come; and the cost cache's byte bound against the memory its
entries really hold.
"""

from __future__ import annotations

import gc
import math
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.layout import boxes_meet
from reshard.planner.builds import Builds
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.reduce import decompose_pieces, reduce_sources
from reshard.planner.cuts import LayoutBoxes, balance_piece, cut_slices
from reshard.planner.estimates import Answer, CostCache, estimate_iter, estimate_many
from reshard.planner.plan import _best_plan, plan_tasks, planned_tensors
from reshard.planner.schedule.floors import baseline_floor
from reshard.planner.values.strategy import Strategy

from ..common import problems

CLUSTERS = (Cluster.preset("dgx-h100", 4, 4),
            Cluster.regular(4, 3, nic_bandwidth=1e9, intra_bandwidth=4e9, latency=2e-5))
PARTIAL = ("RR+P0", "RR+P1", "RR+P01", "S0R+P1", "S1R+P0", "RS0+P1", "RS1+P0")
PLAIN = ("RR", "S0R", "S1R", "S01R", "RS0", "RS1", "RS10", "S0S1", "S1S0")


@st.composite
def partial_moves(draw, rows_of: int = 1024):
    """A partial-sum source on a 2-d mesh moved to a plain layout (disjoint or the same
    devices), large enough that pieces pipeline (``rows_of``: the rows' granularity)."""
    cluster = draw(st.sampled_from(CLUSTERS))
    devices = cluster.devices
    rows, cols = draw(st.sampled_from([(2, 2), (2, 3), (1, 4), (2, 4)]))
    n = rows * cols
    order = draw(st.permutations(devices))
    src = Layout(DeviceMesh((rows, cols), order[:n]), draw(st.sampled_from(PARTIAL)))
    pool = order[n:] if draw(st.booleans()) and len(order) >= 2 * n else order
    dst = Layout(DeviceMesh((rows, cols), pool[:n]), draw(st.sampled_from(PLAIN)))
    shape = (draw(st.integers(1, 64)) * rows_of, draw(st.integers(1, 8)) * 512)
    return shape, "bfloat16", src, dst, cluster


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(partial_moves(), st.booleans())
def test_a_cells_ready_step_is_every_overlapping_piece_s(move, fine):
    shape, dtype, src, dst, cluster = move
    (t,), _ = planned_tensors([(shape, dtype, src, dst)], cluster, None, None)
    loads = Loads(cluster)
    needers = LayoutBoxes().needers(t)
    holders, reduces = reduce_sources(t, 0, loads, needers, balance_piece(cluster, fine))
    ready = {r.box: r.step + 1 for r in reduces}
    if not ready:
        return
    cells, steps = decompose_pieces(t.shape, holders, needers, ready)
    want = [max((s for b, s in ready.items() if boxes_meet(c.box, b)), default=0)
            for c in cells]
    assert steps == want


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(partial_moves(), st.sampled_from(list(Strategy)), st.integers(1, 300))
def test_a_limited_build_is_the_whole_build_or_a_larger_one(move, strategy, limit):
    shape, dtype, src, dst, cluster = move
    tensors, _ = planned_tensors([(shape, dtype, src, dst)], cluster, None, None)
    whole = plan_tasks(tensors, cluster, strategy, fan_out=False)
    got = plan_tasks(tensors, cluster, strategy, fan_out=False, limit=limit)
    assert whole is not None
    if got is None:
        assert len(whole[0]) > limit
    else:
        assert got == whole
    memo = Builds()
    assert memo(tensors, cluster, strategy, False, limit=limit) == got
    assert memo.whole(tensors, cluster, strategy, False) == whole  # after a cut-short one


def _floors(tensors, cluster, strategy):
    fines = (False, True) if any(t.src.spec.is_partial for t in tensors) else (False,)
    out = []
    for fine in fines:
        s = cut_slices(tensors, cluster, strategy, fine=fine)
        out.append(baseline_floor(s.work, s.reduces, s.itemsizes, cluster, strategy))
    return min(out)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(partial_moves(), st.sampled_from([Strategy.SEND_RECV, Strategy.ALLGATHER]))
def test_a_baselines_floor_is_below_its_searched_plan_partial_sums(move, strategy):
    shape, dtype, src, dst, cluster = move
    tensors, _ = planned_tensors([(shape, dtype, src, dst)], cluster, None, None)
    best = _best_plan(tensors, cluster, strategy)
    assert _floors(tensors, cluster, strategy) <= best.estimate()


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.data(), st.sampled_from(CLUSTERS),
       st.sampled_from([Strategy.SEND_RECV, Strategy.ALLGATHER]))
def test_a_baselines_floor_is_below_its_searched_plan_any_layouts(data, cluster, strategy):
    shape, dtype, src, dst = data.draw(problems(cluster.devices, max_ndim=2, max_size=6))
    shape = tuple(d * 4096 for d in shape)  # bytes, not latencies, decide
    tensors, _ = planned_tensors([(shape, dtype, src, dst)], cluster, None, None)
    best = _best_plan(tensors, cluster, strategy)
    assert _floors(tensors, cluster, strategy) <= best.estimate()


def test_a_baseline_its_floor_rules_out_is_neither_built_nor_changes_the_plan():
    # a 64-device all-reduce: point to point, each reduced piece's root sends it 63 times
    cluster = Cluster.preset("dgx-h100", 8)
    mesh = DeviceMesh((8, 8))
    (t,), _ = planned_tensors([((1 << 24,), "bfloat16", Layout(mesh, "R+P01"),
                                Layout(mesh, "R"))], cluster, None, None)
    memo = Builds()
    plan = _best_plan((t,), cluster, Strategy.BROADCAST, memo)
    assert memo.beaten((t,), cluster, Strategy.SEND_RECV, plan.estimate())
    assert _best_plan((t,), cluster, Strategy.SEND_RECV).estimate() >= plan.estimate()
    assert plan.estimate() == reshard.plan((1 << 24,), "bfloat16", Layout(mesh, "R+P01"),
                                           Layout(mesh, "R"), cluster=cluster).estimate()


def _requests(n):
    cluster = Cluster.regular(4, 2)
    a, b = DeviceMesh((2,), [0, 1]), DeviceMesh((2,), [4, 5])
    return [((8 * k, 4), "float32", Layout(a, "S0R"), Layout(b, "RS0"), cluster)
            for k in range(1, n + 1)]


def test_a_long_batch_answers_as_it_goes():
    reqs = _requests(4)
    bad = (*reqs[1][:2], reqs[1][3], reqs[1][3], "no cluster")
    batch = [reqs[0], bad, *reqs[2:]]
    read: list[int] = []

    def lazily():
        for i, r in enumerate(batch):
            read.append(i)
            yield r

    it = estimate_iter(lazily())
    first = next(it)
    assert read == [0]  # answered before the rest of the batch was even read
    assert first == Answer(0, estimate_many([reqs[0]])[0], None)
    rest = list(it)
    assert [a.index for a in rest] == [1, 2, 3]
    assert math.isnan(rest[0].seconds) and isinstance(rest[0].error, reshard.ReshardError)
    assert [a.seconds for a in rest[1:]] == estimate_many(reqs[2:])
    seen: list[Answer] = []
    with pytest.raises(reshard.EstimateError) as err:
        estimate_many(batch, on_answer=seen.append)
    assert [a.index for a in seen] == [0, 1, 2, 3]
    assert [a.seconds for a in seen if a.error is None] == \
        [x for x in err.value.estimates if not math.isnan(x)]
    with pytest.raises(reshard.ReshardError, match="strategy"):
        estimate_iter(batch, strategy="bogus")  # at the call, not at the first answer


def test_the_cache_bound_counts_what_a_thousand_dim_key_holds():
    ndim = 1000
    cluster = Cluster.regular(4, 2)
    a, b = DeviceMesh((2,), [0, 1]), DeviceMesh((2,), [4, 5])

    def fill(cache):
        estimate_many([((2 * k,) + (1,) * (ndim - 1), "float32",
                        Layout(a, "S0" + "R" * (ndim - 1)), Layout(b, "R" * ndim),
                        Cluster.regular(4, 2)) for k in range(1, 4)], cache=cache)

    tracemalloc.start()
    try:
        cache = CostCache(1 << 30)
        fill(cache)
        gc.collect()
        held_with = tracemalloc.get_traced_memory()[0]
        counted = cache.nbytes
        del cache
        gc.collect()
        held = held_with - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held > 6 * ndim * 8  # six keys, each a shape of a thousand slots at least
    assert held <= counted <= 3 * held  # the bound is true, and not wildly over
    assert cluster.footprint > 0


def test_a_small_cache_keeps_fewer_thousand_dim_entries():
    # each entry's key holds 10-40 KB here: a 64 KB cache keeps a few of the eight
    # (weighed at a device id's 16 bytes a key, it kept all eight)
    cache = CostCache(64 << 10)
    a, b = DeviceMesh((2,), [0, 1]), DeviceMesh((2,), [4, 5])
    reqs = [((2 * k,) + (1,) * 999, "float32", Layout(a, "S0" + "R" * 999),
             Layout(b, "R" * 1000), Cluster.regular(4, 2)) for k in range(1, 5)]
    estimate_many(reqs, cache=cache)
    assert 0 < len(cache) <= 4 and cache.nbytes <= 64 << 10


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(partial_moves(rows_of=64))
def test_the_baselines_floors_change_no_plan(move):
    """The same plans with every baseline built and simulated (no floor rules one out)."""
    shape, dtype, src, dst, cluster = move
    tensors, _ = planned_tensors([(shape, dtype, src, dst)], cluster, None, None)
    fast = _best_plan(tensors, cluster, Strategy.BROADCAST)

    class Unpruned(Builds):
        def beaten(self, *args, **kwargs):
            return False

    slow = _best_plan(tensors, cluster, Strategy.BROADCAST, Unpruned())
    assert fast.tasks == slow.tasks and fast.estimate() == slow.estimate()


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(partial_moves(), st.booleans())
def test_a_fanned_out_build_assembled_from_the_first_is_a_fresh_one(move, fine):
    """Fanning out changes no choice: the first build's choices, assembled fanned out,
    are the tasks a fresh fanned-out build makes."""
    shape, dtype, src, dst, cluster = move
    tensors, _ = planned_tensors([(shape, dtype, src, dst)], cluster, None, None)
    memo = Builds()
    first = memo(tensors, cluster, Strategy.BROADCAST, False, fine=fine)
    fanned = memo(tensors, cluster, Strategy.BROADCAST, True, fine=fine)
    assert first == plan_tasks(tensors, cluster, Strategy.BROADCAST, False, fine=fine)
    assert fanned == plan_tasks(tensors, cluster, Strategy.BROADCAST, True, fine=fine)


def test_the_cold_benchmark_times_each_request_and_says_a_goal_only_where_one_is(capsys):
    from reshard.microbench import cold_estimates, estimate_rate

    scale = cold_estimates.Scale(16, 2, ((256, 512),), (("S0R", "RS0"), ("RR+P0", "RS1")),
                                 None, 1e9)
    seen = []
    rows = cold_estimates.run(scale, progress=seen.append)
    assert seen == rows and [(r.src, r.dst) for r in rows] == list(scale.pairs)
    assert all(r.cpu_ms > 0 and r.seconds > 0 for r in rows)
    text = cold_estimates.render(scale, rows, slowest=1)
    median, = (line for line in text.splitlines() if "median" in line)
    top, = (line for line in text.splitlines() if line.strip().startswith("max"))
    assert "goal" not in median and "met" not in median  # no goal: no verdict
    assert "goal <= 1e+09 ms  met" in top
    with pytest.raises(SystemExit) as done:
        cold_estimates.main(["--help"])
    assert done.value.code == 0
    with pytest.raises(SystemExit):
        cold_estimates.main(["--scales", "33"])
    assert "unknown scale '33'" in capsys.readouterr().err
    estimate_rate._line("similar", 0.4, "ms")
    assert "met" not in capsys.readouterr().out

"""Virtual stages in the search (interleaved 1F1B, ZB-V, DualPipeV: several pieces of the
chain on one submesh) and memory as the schedule holds it.

* The objective's relation to the pipeline simulator, as
  :mod:`reshard.search.objective` states it: interleaved 1F1B with equal pieces and
  free moves equals the simulator to the digit; ZB-V and DualPipeV simulate no longer
  and at most ``(p - 1) t`` shorter; with random pieces and moves the simulator never
  runs more than 5% over the objective.
* The stage DP equals an independent brute force of the stated objective (every
  submesh shape that tiles the cluster, every cut into ``v p`` pieces, every candidate
  per layer, each piece within ``1 / v`` of the memory limit at its in-flight count,
  counted here from the simulator's timeline) on random small chains, and so does the
  one-chunk DP with activations held by position (``min(B, p - s)`` under 1F1B).
"""

from __future__ import annotations

import itertools
import math
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reshard import Cluster, SearchError
from reshard.pipeline import PipelineCosts, make_schedule, simulate
from reshard.pipeline.actions import ActionKind
from reshard.pipeline.timeline import Stream
from reshard.planner.estimates import CostCache
from reshard.search import (
    Candidate,
    Layer,
    MoveCosts,
    Stage,
    evaluate,
    objective,
    placements,
    search_chain,
    simulated,
    stage_memory,
)
from reshard.search.kinds import SearchSchedule
from reshard.search.memory import Orders, in_flight
from reshard.search.model import Budget
from reshard.search.simulated import FORWARD_SHARE
from tests.unit._stage_tilings import tiling

F = FORWARD_SHARE


def _sim(name, p, b, times, moves=None):
    """The simulator's iteration time of pieces of ``times`` (forward a third), the
    move into piece ``j`` ``moves[j]`` (there and back, half each)."""
    v = len(times) // p
    order = make_schedule(name, p, b, **({"n_chunks": v} if name == "interleaved-1f1b" else {}))
    moves = moves or [0.0] * len(times)
    half = tuple(moves[j + 1] / 2 for j in range(len(times) - 1))
    costs = PipelineCosts(forward=tuple(t * F for t in times),
                          backward=tuple(t * (1 - F) for t in times),
                          activation_transfer=half or 0.0, gradient_transfer=half or 0.0)
    return simulate(order, costs).iteration_time


def _pieces(times, moves=None):
    moves = moves or [0.0] * len(times)
    place = placements(Cluster.regular(1, 1), (1, 1), 0)
    return [Stage(j, j, place, ("a",), t, 0.0, m) for j, (t, m) in enumerate(zip(times, moves))]


@pytest.mark.parametrize("v", [1, 2, 3])
def test_interleaved_with_equal_pieces_is_the_simulator_to_the_digit(v):
    for p in range(1, 5):
        for b in range(1, 17):
            times = [0.7] * (p * v)
            got = objective(_pieces(times), b, "interleaved-1f1b", chunks=v).time
            want = _sim("interleaved-1f1b", p, b, times)
            assert got == pytest.approx(want, rel=1e-12), (p, b)
            assert got == pytest.approx(0.7 * max(v * p + b - 1, b * v + p - 1))


@pytest.mark.parametrize("name", ["zb-v", "dualpipe-v"])
def test_v_schedules_simulate_no_longer_and_at_most_p_minus_1_pieces_shorter(name):
    for p in range(1, 5):
        for b in range(2 * p if name == "dualpipe-v" else 1, 17):
            times = [0.7] * (2 * p)
            got = objective(_pieces(times), b, name).time
            sim = _sim(name, p, b, times)
            assert sim <= got * (1 + 1e-12), (p, b)
            assert got - sim <= (p - 1) * 0.7 + 1e-9, (p, b)


def test_random_pieces_and_moves_never_simulate_more_than_5_percent_over():
    rng = random.Random(63)
    worst = 0.0
    for _ in range(150):
        name, v = rng.choice([("interleaved-1f1b", 2), ("interleaved-1f1b", 3), ("zb-v", 2)])
        p, b = rng.randint(1, 4), rng.randint(1, 10)
        times = [rng.uniform(0.2, 1.0) for _ in range(p * v)]
        scale = rng.choice([0.0, 0.1, 0.5])
        # a move between two pieces of one submesh is a local handover: none here
        local = {j for j in range(1, p * v) if p == 1 or (name == "zb-v" and j == p)}
        moves = [0.0] + [0.0 if j in local else rng.uniform(0, scale) for j in range(1, p * v)]
        got = objective(_pieces(times, moves), b, name, chunks=v).time
        worst = max(worst, _sim(name, p, b, times, moves) / got)
    assert 1.0 < worst <= 1.05, worst  # over it somewhere, never by more than 5%


def _chunk_peaks(name, p, v, b):
    """Per piece, the most microbatches whose activations it holds at once, counted
    from the simulator's timeline (independent of the search's program walk)."""
    order = make_schedule(name, p, b, **({"n_chunks": v} if name == "interleaved-1f1b" else {}))
    timeline = simulate(order, PipelineCosts())
    deltas: dict[int, list[tuple[float, int, int]]] = {}
    for k, e in enumerate(timeline.events):
        action = e.parsed_action()
        if e.stream is not Stream.COMPUTE or action is None:
            continue
        piece = order.virtual_stage(e.stage, action.chunk)
        step = {ActionKind.FORWARD: 1, ActionKind.BACKWARD: -1,
                ActionKind.BACKWARD_WEIGHT: -1}.get(action.kind, 0)
        deltas.setdefault(piece, []).append((e.end, k, step))
    peaks = []
    for piece in range(p * v):
        held = most = 0
        for _, _, step in sorted(deltas.get(piece, [])):
            held += step
            most = max(most, held)
        peaks.append(most)
    return peaks


SPECS = ("RR", "S0R", "RS1", "S01R")
SHAPES = ((1, 1), (1, 2), (2, 2))


def _submesh_order(name, p, v):
    if name in ("zb-v", "dualpipe-v"):
        return list(range(p)) + list(reversed(range(p)))
    return [j % p for j in range(p * v)]


def _tilings(cluster, name, v, b, n):
    """Every (submesh per piece, in-flight count per piece): one-chunk schedules any
    sequence of shapes that tiles the cluster in order; virtual ones one shape."""
    total = len(cluster.devices)
    if v == 1:
        for k in range(1, n + 1):
            for shapes in itertools.product(SHAPES, repeat=k):
                subs = tiling(cluster, shapes)
                if subs is not None:
                    yield subs, [min(b, (k - s) * (2 if name == "eager-1f1b" else 1)
                                     - (name == "eager-1f1b")) for s in range(k)]
        return
    for shape in SHAPES:
        size = shape[0] * shape[1]
        p = total // size
        subs = [placements(cluster, shape, k * size) for k in range(p)]
        if total % size or None in subs or p * v > n or (name == "dualpipe-v" and b < 2 * p):
            continue
        yield [subs[k] for k in _submesh_order(name, p, v)], _chunk_peaks(name, p, v, b)


def _brute(layers, cluster, b, name, v, limit, costs, edges=None):
    """The least objective over every choice of the stated objective (inf: none):
    every submesh per piece (virtual schedules: one shape), every cut, every candidate,
    each piece within its share of the limit at its in-flight count; ``edges``: a
    graph's, priced as the objective prices them (default: the chain's)."""
    n, best = len(layers), math.inf
    for subs, counts in _tilings(cluster, name, v, b, n):
        pieces = len(subs)
        for cuts in itertools.combinations(range(1, n), pieces - 1):
            ends = (0, *cuts, n)
            bounds = [(ends[j], ends[j + 1] - 1) for j in range(pieces)]
            per = [layers[k].candidates.get(subs[j].shape, ())
                   for j, (a, z) in enumerate(bounds) for k in range(a, z + 1)]
            for picks in itertools.product(*per):
                if any(sum(c.memory + counts[j] * c.activations for c in picks[a:z + 1])
                       > limit / v for j, (a, z) in enumerate(bounds)):
                    continue
                stages = [Stage(a, z, subs[j], tuple(c.name for c in picks[a:z + 1]), 0, 0, 0)
                          for j, (a, z) in enumerate(bounds)]
                priced = evaluate(layers, stages, cluster, b, name, costs, edges=edges,
                                  chunks=v).stages
                best = min(best, _formula(priced, b, v, name))
    return best


def _formula(stages, b, v, name):
    """The stated objective: ``max(S + (B - 1) t, S / v + (B v - 1) t)``."""
    s = sum(x.compute + x.inner + x.move_in for x in stages)
    if name == "eager-1f1b":
        t = max(max(x.compute + x.inner, x.move_in) for x in stages)
    else:
        t = max(x.compute + x.inner + x.move_in for x in stages)
    return max(s + (b - 1) * t, s / v + (b * v - 1) * t)


VIRTUAL = (("interleaved-1f1b", 2), ("interleaved-1f1b", 3), ("zb-v", 2), ("dualpipe-v", 2))
ONE_CHUNK = (("1f1b", 1), ("eager-1f1b", 1))


@st.composite
def instances(draw, schedules, limits):
    cluster = draw(st.sampled_from((Cluster.regular(1, 2), Cluster.regular(2, 2))))
    name, v = draw(st.sampled_from(schedules))
    n = draw(st.integers(2, 6))
    most = {2: 3, 3: 3, 4: 2, 5: 2, 6: 2}[n]
    shapes = draw(st.lists(st.sampled_from(SHAPES), min_size=1, max_size=3, unique=True))
    layers = []
    for k in range(n):
        cands = {shape: tuple(
            Candidate(f"c{j}", draw(st.integers(1, 40)) * 1e-4, draw(st.sampled_from(SPECS)),
                      draw(st.sampled_from(SPECS)), draw(st.integers(0, 3)), 0,
                      draw(st.integers(0, 2)))
            for j in range(draw(st.integers(1, most)))) for shape in shapes}
        layers.append(Layer(f"l{k}", (draw(st.sampled_from((16, 512))), 64), "float32", cands))
    return cluster, layers, draw(st.integers(1, 8)), name, v, draw(st.sampled_from(limits))


@pytest.fixture(scope="module")
def cache():
    return CostCache()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=instances(VIRTUAL, (math.inf, 8, 14)))
def test_the_dp_equals_brute_force_with_virtual_stages_and_activations(case, cache):
    _equals_brute_force(case, cache)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=instances(ONE_CHUNK, (6, 8, 14)))
def test_the_one_chunk_dp_holds_activations_by_position(case, cache):
    """A stage ``s`` of ``p`` holds ``min(B, p - s)`` microbatches' activations under
    1F1B, ``min(B, 2 (p - s) - 1)`` under eager 1F1B (the DP counts the stages to come)."""
    _equals_brute_force(case, cache)


def _equals_brute_force(case, cache):
    cluster, layers, b, name, v, limit = case
    costs = MoveCosts(cluster, cache=cache)
    want = _brute(layers, cluster, b, name, v, limit, costs)
    kw = {"schedule": name, "cache": cache, "rerank": 0,
          "memory_limit": None if limit == math.inf else limit,
          "chunks": v if name == "interleaved-1f1b" else None}
    if want == math.inf:
        with pytest.raises(SearchError):
            search_chain(layers, cluster, b, **kw)
        return
    got = search_chain(layers, cluster, b, **kw)
    assert got.time == pytest.approx(want, rel=1e-9, abs=1e-15)
    assert got.chunks == v and len(got.stages) % v == 0
    assert _formula(got.stages, b, v, name) == pytest.approx(got.time, rel=1e-9, abs=1e-15)
    # every piece holds what the schedule holds within its share of the limit
    assert all(m <= limit / v for m in stage_memory(layers, got))


def test_a_virtual_choice_simulates_its_own_schedule():
    """Four equal layers on two single-device submeshes, moves of a 4-byte activation:
    interleaved 1F1B of two pieces per submesh simulates as the objective says, and
    shorter than 1F1B of two stages; ZB-V's V puts pieces 1 and 2 on one submesh."""
    cluster = Cluster.regular(1, 2)
    cands = {(1, 1): (Candidate("a", 1.0, "R", "R"),)}
    layers = [Layer(f"l{k}", (1,), "float32", cands) for k in range(4)]
    inter = search_chain(layers, cluster, 8, schedule="interleaved-1f1b")
    assert [s.placement.first for s in inter.stages] == [0, 1, 0, 1]
    assert simulated(layers, inter, cluster) == pytest.approx(inter.time, rel=1e-4)
    assert inter.time == pytest.approx(8 * 2 + 2 - 1, rel=1e-4)  # (B v + p - 1) t
    plain = search_chain(layers, cluster, 8)
    assert inter.time < plain.time
    v = search_chain(layers, cluster, 8, schedule="zb-v")
    assert [s.placement.first for s in v.stages] == [0, 1, 1, 0]
    assert simulated(layers, v, cluster) <= v.time
    with pytest.raises(SearchError, match="'1f1b' runs 1 chunks per stage"):
        simulated(layers, v, cluster, schedule="1f1b")
    with pytest.raises(SearchError, match="runs 2 chunks per submesh, got chunks=3"):
        search_chain(layers, cluster, 8, schedule="zb-v", chunks=3)


@pytest.mark.parametrize("name,v", [("interleaved-1f1b", 2), ("interleaved-1f1b", 3),
                                     ("zb-v", 2), ("dualpipe-v", 2)])
def test_kept_orders_give_the_counts_a_fresh_schedule_gives_and_are_built_once(name, v):
    """A search's kept pipeline schedules (``Orders``) count in-flight microbatches as a
    schedule built afresh does, each (name, stages, microbatches, chunks) built once;
    the simulator under kept orders times a choice as it does without them."""
    kinds = SearchSchedule(name)
    orders = Orders()
    for p, b in [(2, 4), (3, 6), (2, 4)]:
        assert in_flight(kinds, p, v, b, orders) == in_flight(kinds, p, v, b)
    assert len(orders.built) == 2
    first = orders.get(name, 2, 4, v)
    assert orders.get(name, 2, 4, v) is first and first.num_chunks == v
    cluster = Cluster.regular(1, 2)
    cands = {(1, 1): (Candidate("a", 1.0, "R", "R"),)}
    layers = [Layer(f"l{k}", (1,), "float32", cands) for k in range(2 * v)]
    got = search_chain(layers, cluster, 4, schedule=name, chunks=v if v != 2 else None)
    assert simulated(layers, got, cluster, orders=orders) == simulated(layers, got, cluster)


def test_kept_orders_check_the_budget_before_each_build():
    """A spent budget stops a search before it builds another pipeline schedule (naming
    it), while a schedule already built is still given."""
    budget = Budget.of(0.01)
    orders = Orders(budget=budget)
    kept = orders.get("interleaved-1f1b", 2, 4, 2)
    while budget.left() > 0:
        time.sleep(0.005)
    assert orders.get("interleaved-1f1b", 2, 4, 2) is kept
    with pytest.raises(SearchError, match=r"past its time_limit .* building the zb-v "
                                          r"pipeline schedule of 4 submeshes and 8 micro"):
        orders.get("zb-v", 4, 8, 2)
    assert list(orders.built) == [("interleaved-1f1b", 2, 4, 2)]


@pytest.mark.parametrize("name", ["zb-v", "eager-zb-v"])
def test_a_long_v_build_checks_inside_and_stops_when_its_check_raises(name):
    """A ZB-V build (seconds for 16 submeshes of 128 microbatches) calls its check
    between candidates and inside list scheduling, gives the same schedule as without
    one, and stops at once when the check raises (a search's spent budget does:
    test_kept_orders_check_the_budget_before_each_build)."""
    from reshard.pipeline import v_schedules

    calls: list[int] = []
    built = make_schedule(name, 8, 32, check=lambda: calls.append(1))
    assert built == make_schedule(name, 8, 32)
    between: list[int] = []  # the checks between candidates alone
    with pytest.MonkeyPatch.context() as m:
        m.setattr(v_schedules, "CHECK_EVERY", 10**9)
        make_schedule(name, 8, 32, check=lambda: between.append(1))
    assert between and len(calls) > 2 * len(between)  # inside list scheduling too

    class Stop(Exception):
        pass

    seen = []

    def stop() -> None:
        seen.append(1)
        if len(seen) == 3:
            raise Stop

    with pytest.raises(Stop):
        make_schedule(name, 16, 128, check=stop)
    assert len(seen) == 3

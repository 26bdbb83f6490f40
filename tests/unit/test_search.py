"""The stage and layout search (reshard.search): exact for its objective.

The DP's answer equals brute force (every split of the chain into stages, every
sequence of submeshes that tiles the cluster, every candidate per layer, each priced
by reshard's estimates through :func:`reshard.search.evaluate`) on random small
instances (up to 6 layers, 4 candidates, 3 submesh shapes), both schedules, with and without a memory limit; the choice made with moves
free (Alpa's stage DP) is never better once its moves are priced, and worse where a
move crosses a slow network; bad input is refused before any search runs."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reshard import Cluster, SearchError
from reshard.planner.estimates import CostCache
from reshard.search import Candidate, Layer, Stage, evaluate, search_chain
from tests.unit._stage_tilings import stage_tilings

CLUSTER = Cluster.regular(2, 2)
SHAPES = ((1, 1), (1, 2), (2, 2))
SPECS = ("RR", "S0R", "RS1", "S1R", "RS0", "S01R", "RS01")


def _brute(layers, cluster, microbatches, schedule, limit, cache):
    """The least objective over every choice (None: no choice is feasible)."""
    best = math.inf
    for bounds, places in stage_tilings(cluster, len(layers), SHAPES):
        per_layer = []
        for (a, b), p in zip(bounds, places):
            for k in range(a, b + 1):
                per_layer.append(layers[k].candidates.get(p.shape, ()))
        for picks in itertools.product(*per_layer):
            stages, k = [], 0
            ok = True
            for (a, b), p in zip(bounds, places):
                mine = picks[k:k + b - a + 1]
                k += b - a + 1
                if sum(c.memory for c in mine) > limit:
                    ok = False
                    break
                stages.append(Stage(a, b, p, tuple(c.name for c in mine), 0.0, 0.0, 0.0))
            if not ok:
                continue
            t = evaluate(layers, stages, cluster, microbatches, schedule,
                         _costs(cache)).time
            best = min(best, t)
    return None if best == math.inf else best


def _costs(cache):
    from reshard.search import MoveCosts

    return MoveCosts(CLUSTER, cache=cache)


@st.composite
def instances(draw):
    # up to 6 layers, 4 candidates per submesh shape, 3 shapes (the brute force's
    # candidate products kept to a few thousand: fewer candidates on longer chains)
    n = draw(st.integers(1, 6))
    shapes = draw(st.lists(st.sampled_from(SHAPES), min_size=1, max_size=3, unique=True))
    most = {1: 4, 2: 4, 3: 4, 4: 3, 5: 2, 6: 2}[n]
    layers = []
    for k in range(n):
        cands = {}
        for shape in shapes:
            m = draw(st.integers(1, most if len(shapes) < 3 else min(most, 3)))
            cands[shape] = tuple(
                Candidate(f"c{j}", draw(st.integers(1, 40)) * 1e-4,
                          draw(st.sampled_from(SPECS)), draw(st.sampled_from(SPECS)),
                          draw(st.integers(0, 3)))
                for j in range(m))
        rows = draw(st.sampled_from((16, 256, 2048)))
        layers.append(Layer(f"l{k}", (rows, 64), "float32", cands))
    return (layers, draw(st.integers(1, 8)), draw(st.sampled_from(("1f1b", "eager-1f1b"))),
            draw(st.sampled_from((math.inf, 4, 6))))


@pytest.fixture(scope="module")
def cache():
    return CostCache()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=instances())
def test_dp_equals_brute_force(case, cache):
    layers, b, schedule, limit = case
    want = _brute(layers, CLUSTER, b, schedule, limit, cache)
    kw = {"schedule": schedule, "cache": cache, "rerank": 0,
          "memory_limit": None if limit == math.inf else limit}
    if want is None:
        with pytest.raises(SearchError):
            search_chain(layers, CLUSTER, b, **kw)
        return
    got = search_chain(layers, CLUSTER, b, **kw)
    assert got.time == pytest.approx(want, rel=1e-9, abs=1e-15)
    # its stages tile the layers and the devices, in order, and cost what it says
    assert [s.first for s in got.stages] == [0] + [s.last + 1 for s in got.stages[:-1]]
    assert got.stages[-1].last == len(layers) - 1
    assert sum(s.placement.size for s in got.stages) == len(CLUSTER.devices)
    again = evaluate(layers, got.stages, CLUSTER, b, schedule, _costs(cache))
    assert again.time == pytest.approx(got.time, rel=1e-9, abs=1e-15)
    assert got.compute + got.transfer + got.bubble == pytest.approx(got.time)
    # the choice made with moves free is never better, priced
    free = search_chain(layers, CLUSTER, b, moves="free", **kw)
    assert free.time >= got.time * (1 - 1e-9)


def test_priced_moves_change_the_choice_on_a_slow_network():
    """Two hosts of one device on 10 Gbit/s: a 2-stage pipeline computes a little
    faster, but its activation (64 MiB) crosses the network each microbatch; one
    data-parallel stage over both hosts moves nothing. Alpa's stage DP (moves free)
    takes the pipeline; priced, the search keeps one stage, and is faster."""
    cluster = Cluster.regular(2, 1)
    big = (4096, 4096)
    layers = [Layer(f"l{k}", big, "float32", {
        (1, 1): (Candidate("one", 10e-3, "RR", "RR"),),
        (2, 1): (Candidate("dp", 6e-3, "S0R", "S0R"),),
    }) for k in range(2)]
    free = search_chain(layers, cluster, 8, moves="free")
    priced = search_chain(layers, cluster, 8)
    assert len(free.stages) == 2 and len(priced.stages) == 1
    assert priced.time < free.time
    assert free.stages[1].move_in > 0  # the free choice evaluated with its real move


def test_bad_input_is_refused_before_searching():
    ok = Layer("ok", (8, 8), "float32", {(1, 1): (Candidate("c", 1e-3, "RR", "RR"),)})
    with pytest.raises(SearchError, match="no layers"):
        search_chain([], CLUSTER, 4)
    with pytest.raises(SearchError, match=r"layer 1 \('empty'\) has no candidate"):
        search_chain([ok, Layer("empty", (8, 8), "float32", {})], CLUSTER, 4)
    with pytest.raises(SearchError, match="microbatches"):
        search_chain([ok], CLUSTER, 0)
    with pytest.raises(SearchError, match="unknown schedule"):
        search_chain([ok], CLUSTER, 4, schedule="gpipe-ish")
    with pytest.raises(SearchError, match="numbered host by host"):
        search_chain([ok], Cluster.from_hosts([[0, 1], [2]]), 4)
    with pytest.raises(SearchError, match="compute"):
        Candidate("bad", -1.0, "RR", "RR")
    heavy = Layer("heavy", (8, 8), "float32",
                  {(1, 1): (Candidate("c", 1e-3, "RR", "RR", memory=10),)})
    with pytest.raises(SearchError, match="memory limit"):
        search_chain([heavy] * 4, CLUSTER, 4, memory_limit=5)
    with pytest.raises(SearchError, match="cannot tile"):  # 3 layers cannot fill 4 devices
        search_chain([ok] * 3, CLUSTER, 4)


def _gpt_layers():
    from reshard.search.transformer import GPT, gpt_layers

    model = GPT("tiny", 20, 256, 4, seq=128, microbatch=4, batch=64)
    cluster = Cluster.regular(2, 2, preset="aws-p3.8xlarge")
    return model, cluster, gpt_layers(model, cluster, 125e12)


def test_blocks_search_between_blocks_and_price_the_layers():
    """20 layers search in blocks of 2 (MAX_BLOCKS 16): stage boundaries fall between
    blocks, the time is the objective of the chosen stages on the layers themselves,
    and it is never better than the search layer by layer."""
    model, cluster, layers = _gpt_layers()
    cache = CostCache()
    blocked = search_chain(layers, cluster, model.microbatches, cache=cache)
    assert all(s.first % 2 == 0 for s in blocked.stages)
    again = evaluate(layers, blocked.stages, cluster, model.microbatches, "1f1b",
                     _costs_for(cluster, cache))
    assert again.time == pytest.approx(blocked.time, rel=1e-12)
    exact = search_chain(layers, cluster, model.microbatches, cache=cache, block=1)
    assert exact.time <= blocked.time * (1 + 1e-12)
    with pytest.raises(SearchError, match="block"):
        search_chain(layers, cluster, model.microbatches, block=0)


def _costs_for(cluster, cache):
    from reshard.search import MoveCosts

    return MoveCosts(cluster, cache=cache)


def test_transformer_candidates_and_the_baselines():
    """The analytical layer: tp pays its activation all-reduces and holds 1/g of the
    weights; the search's choice is at least as fast as Megatron's uniform choice and
    as Alpa's (moves free), all three within the memory limit."""
    from reshard.search.baselines import uniform

    model, cluster, layers = _gpt_layers()
    (dp,) = layers[0].candidates[(1, 1)]
    dp2, tp2 = layers[0].candidates[(1, 2)]
    assert dp.name == "dp" and tp2.name == "tp"
    assert dp2.compute < dp.compute and tp2.compute > dp2.compute  # tp's collectives
    assert tp2.memory < dp2.memory  # half the weights
    limit = 2 * sum(c.memory for c in (dp2,)) * 20
    mine = search_chain(layers, cluster, model.microbatches, memory_limit=limit)
    alpa = search_chain(layers, cluster, model.microbatches, memory_limit=limit,
                        moves="free")
    mega = uniform(layers, cluster, model.microbatches, memory_limit=limit)
    assert mine.time <= alpa.time * (1 + 1e-12) and mine.time <= mega.time * (1 + 1e-12)


def test_the_simulator_agrees_with_the_objective_where_moves_are_nothing_and_reranks():
    # four equal layers on four single-device stages, moves of a 4-byte activation
    # (latency only) beside 1 s of compute: the simulated 1F1B is (B + S - 1)(F + B),
    # which is the objective's sum + (B - 1) max
    from reshard.search import best_few, rerank, simulated

    cluster = Cluster.regular(1, 4)
    cands = {(1, 1): (Candidate("a", 1.0, "R", "R"),)}
    layers = [Layer(f"l{k}", (1,), "float32", cands) for k in range(4)]
    for schedule in ("1f1b", "eager-1f1b"):
        got = search_chain(layers, cluster, 8, schedule=schedule)
        assert len(got.stages) == 4
        assert simulated(layers, got, cluster) == pytest.approx(got.time, rel=1e-4)
        assert got.time == pytest.approx(11.0, rel=1e-4)
    # the DP's best few, re-ranked: the same choices, least simulated time first, each
    # simulated as on its own
    cluster = Cluster.regular(2, 2)
    cands = {(1, 1): (Candidate("a", 1e-3, "S0R", "S0R"),),
             (1, 2): (Candidate("b", 6e-4, "S1R", "S1R"), Candidate("c", 5e-4, "RR", "RR")),
             (2, 2): (Candidate("d", 9e-4, "S01R", "S01R"),)}
    layers = [Layer(f"l{k}", (256, 64), "float32", cands) for k in range(4)]
    few = best_few(layers, cluster, 6, 4)
    assert len(few) > 1 and [c.time for c in few] == sorted(c.time for c in few)
    ranked = rerank(layers, few, cluster)
    assert sorted(c.time for c in ranked) == sorted(c.time for c in few)
    assert [c.simulated for c in ranked] == sorted(c.simulated for c in ranked)
    for c in ranked:
        assert c.simulated == pytest.approx(simulated(layers, c, cluster))


def test_blocks_keep_mixed_candidates_of_layers_of_two_kinds():
    # 20 layers (blocks of 2): dense layers (dp, tp) and expert layers (dp, ep) in turn;
    # the best runs dense dp with expert ep in one layout: a block must keep that mix,
    # so the search is no slower than Megatron's one candidate per kind of layer
    from reshard.search.baselines import uniform

    cluster = Cluster.regular(1, 2)
    dense = {s: (Candidate("dp", 1e-3, "S01R", "S01R", 4), Candidate("tp", 2e-3, "S0R", "S0R", 2))
             for s in ((1, 1), (1, 2))}
    expert = {s: (Candidate("dp", 3e-3, "S01R", "S01R", 8), Candidate("ep", 1e-3, "S01R", "S01R", 2))
              for s in ((1, 1), (1, 2))}
    layers = [Layer(f"l{k}", (64, 64), "float32", expert if k % 2 else dense)
              for k in range(20)]
    got = search_chain(layers, cluster, 8)
    mega = uniform(layers, cluster, 8)
    assert got.time <= mega.time * (1 + 1e-9)
    assert {n for s in got.stages for n in s.choices[1::2]} == {"ep"}
    assert {n for s in got.stages for n in s.choices[0::2]} == {"dp"}
    # under a memory limit the Pareto front of a block keeps the lighter mix too
    light = search_chain(layers, cluster, 8, memory_limit=40)
    assert all(sum(4 if n == "dp" and k % 2 == 0 else 2 if n in ("tp", "ep") else 8
                   for k, n in zip(range(s.first, s.last + 1), s.choices)) <= 40
               for s in light.stages)


def test_the_simulator_takes_another_one_chunk_schedule():
    from reshard.search import simulated

    cluster = Cluster.regular(1, 4)
    cands = {(1, 1): (Candidate("a", 1.0, "R", "R"),)}
    layers = [Layer(f"l{k}", (1,), "float32", cands) for k in range(4)]
    got = search_chain(layers, cluster, 8)
    one = simulated(layers, got, cluster)
    # zero bubble H1 fills the 1F1B bubble with weight gradients: shorter; GPipe the same
    assert simulated(layers, got, cluster, schedule="zb-h1") < one
    assert simulated(layers, got, cluster, schedule="gpipe") == pytest.approx(one, rel=1e-3)
    with pytest.raises(SearchError, match="'zb-v' runs 2 chunks per stage"):
        simulated(layers, got, cluster, schedule="zb-v")
    with pytest.raises(SearchError, match="unknown schedule 'zb-w'"):
        simulated(layers, got, cluster, schedule="zb-w")

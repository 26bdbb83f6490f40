"""The stage DP that knows a graph's skip connections (reshard.search.skips): on random
small DAGs its own answer (no descent, no re-ranking) equals an independent brute force
over stages, submeshes and candidates together, with and without a memory limit; a
graph too wide for it is searched as before; the graph that was refused as 'cannot
tile the cluster' gets its optimum."""

from __future__ import annotations

import itertools
import math
import random

import pytest

import reshard.search.chain as chain_mod
import reshard.search.skips as skips_mod
from reshard import Cluster, SearchError
from reshard.planner.estimates import CostCache
from reshard.search import (
    Candidate,
    Graph,
    Layer,
    Stage,
    search_chain,
    search_graph,
)
from reshard.search.costs import MoveCosts
from reshard.search.graph import evaluate_graph
from reshard.search.skips import Edges
from tests.unit._stage_tilings import stage_tilings
from tests.unit.test_search_virtual import SHAPES as VSHAPES
from tests.unit.test_search_virtual import SPECS as VSPECS
from tests.unit.test_search_virtual import _brute as _brute_virtual
from tests.unit.test_search_virtual import _formula

CLUSTER = Cluster.regular(2, 2)
SHAPES = ((1, 1), (1, 2), (2, 2))
SPECS = ("RR", "S0R", "RS1", "S1R", "RS0", "S01R", "RS01")


def _brute(graph, b, sched, costs, limit):
    """The least graph objective over every tiling and every candidate of every layer,
    each stage's candidates' memory within ``limit`` (inf: none)."""
    layers, best = graph.layers, math.inf
    for bounds, places in stage_tilings(CLUSTER, len(layers), SHAPES):
        per = [layers[k].candidates.get(p.shape, ()) for (a, z), p in zip(bounds, places)
               for k in range(a, z + 1)]
        for picks in itertools.product(*per):
            if any(sum(c.memory for c in picks[a:z + 1]) > limit for a, z in bounds):
                continue
            stages = [Stage(a, z, p, tuple(c.name for c in picks[a:z + 1]), 0, 0, 0)
                      for (a, z), p in zip(bounds, places)]
            best = min(best, evaluate_graph(graph, stages, CLUSTER, b, sched, costs).time)
    return best


def _graph(rng, n):
    layers = tuple(Layer(f"l{k}", (1024, 512), "float32", {
        shape: tuple(Candidate(f"c{j}", rng.uniform(1e-5, 3e-4), rng.choice(SPECS),
                               rng.choice(SPECS), rng.randint(0, 4))
                     for j in range(rng.randint(1, 3)))
        for shape in SHAPES if not (rng.random() < 0.2 and shape != (2, 2))})
        for k in range(n))
    edges = {(k, k + 1) for k in range(n - 1) if rng.random() < 0.8}
    edges |= {(u, v) for u in range(n) for v in range(u + 2, n) if rng.random() < 0.6}
    return Graph(layers, tuple(edges))


@pytest.mark.timeout(900)
def test_the_skip_aware_dp_equals_the_brute_force_on_random_dags():
    rng = random.Random(63)
    cache = CostCache()
    costs = MoveCosts(CLUSTER, cache=cache)
    total = used = blind_misses = 0
    for _ in range(300):
        graph = _graph(rng, rng.randint(2, 4))
        b, sched = rng.randint(1, 8), rng.choice(["1f1b", "eager-1f1b"])
        limit = rng.choice([None, None, 5])
        want = _brute(graph, b, sched, costs, math.inf if limit is None else limit)
        if want == math.inf:
            continue
        used += Edges.of(len(graph.layers), graph.edges).skips()
        got = search_chain(list(graph.layers), CLUSTER, b, schedule=sched, cache=cache,
                           memory_limit=limit, edges=graph.edges, rerank=0)
        # the DP's own time is the graph's objective of its stages
        assert got.time == pytest.approx(
            evaluate_graph(graph, got.stages, CLUSTER, b, sched, costs).time)
        assert got.time == pytest.approx(want, rel=1e-9), (sorted(graph.edges), b, sched)
        total += 1
        # the chain DP blind to the skips (consecutive edges alone), priced on the graph
        chained = tuple((u, v) for u, v in graph.edges if v == u + 1)
        blind = search_chain(list(graph.layers), CLUSTER, b, schedule=sched, cache=cache,
                             memory_limit=limit, edges=chained, rerank=0)
        blind_misses += evaluate_graph(graph, blind.stages, CLUSTER, b, sched,
                                       costs).time > want * (1 + 1e-9)
    assert total >= 250 and used >= 0.5 * total, (total, used)
    assert blind_misses >= 0.05 * total, (blind_misses, total)  # the skips matter


@pytest.mark.timeout(600)
def test_the_graph_search_reaches_the_global_optimum_on_dags_of_up_to_five_layers():
    rng = random.Random(4)
    cache = CostCache()
    costs = MoveCosts(CLUSTER, cache=cache)
    total = 0
    for _ in range(60):
        graph = _graph(rng, rng.randint(2, 5))
        b, sched = rng.randint(1, 8), rng.choice(["1f1b", "eager-1f1b"])
        want = _brute(graph, b, sched, costs, math.inf)
        if want == math.inf:
            continue
        got = search_graph(graph, CLUSTER, b, schedule=sched, cache=cache, rerank=False)
        assert got.time == pytest.approx(want, rel=1e-9), (sorted(graph.edges), b, sched)
        total += 1
    assert total >= 40


def test_layers_that_do_not_feed_the_next_get_the_optimum():
    """Edges (0, 2), (1, 3) on 2 x 2 devices (once refused as 'cannot tile the
    cluster'): the DP prices both skips and its answer is the brute force's."""
    wide = {(1, 1): (Candidate("a", 1e-3, "S0R", "S0R"),),
            (1, 2): (Candidate("b", 6e-4, "S0R", "S1R"),)}
    flat = {(1, 1): (Candidate("a", 1e-3, "S0", "S0"),),
            (1, 2): (Candidate("b", 6e-4, "S0", "S1"),)}
    layers = (Layer("l0", (1024, 64), "float32", wide), Layer("l1", (4096,), "float32", flat),
              Layer("l2", (1024, 64), "float32", wide), Layer("l3", (4096,), "float32", flat))
    graph = Graph(layers, ((0, 2), (1, 3)))
    costs = MoveCosts(CLUSTER)
    got = search_chain(list(layers), CLUSTER, 4, edges=graph.edges, rerank=0)
    assert got.time == pytest.approx(_brute(graph, 4, "1f1b", costs, math.inf))


def test_a_graph_too_wide_for_the_dp_is_searched_as_before(monkeypatch):
    """A U of 10 layers leaves 4 producers open in its middle (> MAX_OPEN): the chain
    DP's stages, the skips priced after; a DP that outgrows MAX_STATES falls back too."""
    cands = {(1, 1): (Candidate("a", 1e-4, "S0R", "S0R"), Candidate("b", 2e-4, "RS1", "RS1")),
             (1, 2): (Candidate("c", 6e-5, "S0R", "S1R"),)}
    layers = tuple(Layer(f"l{k}", (1024, 64), "float32", cands) for k in range(10))
    edges = tuple((k, k + 1) for k in range(9)) + tuple((4 - i, 5 + i) for i in range(1, 5))
    graph = Graph(layers, edges)
    assert Edges.of(10, graph.edges).width() == 5 > skips_mod.MAX_OPEN
    wide = search_graph(graph, CLUSTER, 4, rerank=False)
    assert wide.time == pytest.approx(evaluate_graph(graph, wide.stages, CLUSTER, 4).time)
    # narrow enough for the DP, but its states capped: the same answer as the chain DP's
    small = Graph(layers[:4], ((0, 1), (1, 2), (2, 3), (0, 3)))
    exact = search_chain(list(small.layers), CLUSTER, 4, edges=small.edges, rerank=0)
    monkeypatch.setattr(skips_mod, "MAX_STATES", 1)
    capped = search_chain(list(small.layers), CLUSTER, 4, edges=small.edges, rerank=0)
    monkeypatch.setattr(chain_mod, "MAX_OPEN", -1)
    blind = search_chain(list(small.layers), CLUSTER, 4, edges=small.edges, rerank=0)
    def cut(c):
        return [(st.first, st.last, st.placement, st.choices) for st in c.stages]

    assert cut(capped) == cut(blind)  # the blind DP's stages, priced on the graph
    assert capped.time == pytest.approx(evaluate_graph(small, blind.stages, CLUSTER, 4).time)
    assert exact.time <= evaluate_graph(small, blind.stages, CLUSTER, 4).time * (1 + 1e-12)


@pytest.mark.timeout(900)
def test_the_skip_aware_dp_equals_the_brute_force_with_virtual_stages_and_activations():
    rng = random.Random(6363)
    cache = CostCache()
    schedules = (("1f1b", 1), ("eager-1f1b", 1), ("interleaved-1f1b", 2), ("zb-v", 2),
                 ("dualpipe-v", 2))
    checked = refused = 0
    for _ in range(200):
        cluster = rng.choice((Cluster.regular(1, 2), Cluster.regular(2, 2)))
        costs = MoveCosts(cluster, cache=cache)
        name, v = rng.choice(schedules)
        n = rng.randint(3, 5)
        shapes = rng.sample(VSHAPES, rng.randint(1, 3))
        layers = [Layer(f"l{k}", (rng.choice((16, 512)), 64), "float32", {
            shape: tuple(Candidate(f"c{j}", rng.randint(1, 40) * 1e-4, rng.choice(VSPECS),
                                   rng.choice(VSPECS), rng.randint(0, 3), 0, rng.randint(0, 2))
                         for j in range(rng.randint(1, 2))) for shape in shapes})
            for k in range(n)]
        edges = tuple({(k, k + 1) for k in range(n - 1) if rng.random() < 0.8}
                      | {(u, w) for u in range(n) for w in range(u + 2, n) if rng.random() < 0.5})
        if Edges.of(n, edges).width() > skips_mod.MAX_OPEN:
            continue  # searched blind to the skips (the test above)
        limit = rng.choice((math.inf, 8, 14))
        want = _brute_virtual(layers, cluster, rng_b := rng.randint(1, 8), name, v, limit,
                              costs, edges=edges)
        kw = {"schedule": name, "cache": cache, "rerank": 0, "edges": edges,
              "memory_limit": None if limit == math.inf else limit,
              "chunks": v if name == "interleaved-1f1b" else None}
        if want == math.inf:
            with pytest.raises(SearchError):
                search_chain(layers, cluster, rng_b, **kw)
            refused += 1
            continue
        got = search_chain(layers, cluster, rng_b, **kw)
        assert got.time == pytest.approx(want, rel=1e-9, abs=1e-15), (name, edges, rng_b)
        assert _formula(got.stages, rng_b, v, name) == pytest.approx(got.time, rel=1e-9,
                                                                      abs=1e-15)
        checked += 1
    assert checked >= 60, (checked, refused)


@pytest.mark.timeout(120)
def test_the_skip_aware_dp_stops_at_its_deadline():
    """A 7-layer DAG of 3 candidates per shape on 2 x 4 devices (about 9 s of CPU here):
    with no baselines to spend the time first, a 1 s limit stops it inside the skip
    phases, named, within 0.5 s of the deadline."""
    import time

    from reshard.search.chain import best_few

    rng = random.Random(1)
    shapes = [(1, 1), (1, 2), (1, 4), (2, 4)]
    n = 7
    layers = [Layer(f"l{k}", (1024, 512), "float32", {
        s: tuple(Candidate(f"c{j}", rng.uniform(1e-4, 3e-3), rng.choice(SPECS),
                           rng.choice(SPECS), rng.randint(0, 4)) for j in range(3))
        for s in shapes}) for k in range(n)]
    edges = tuple((k, k + 1) for k in range(n - 1)) + tuple((k, k + 3) for k in range(0, n - 3, 2))
    start = time.monotonic()
    with pytest.raises(SearchError, match=r"ran past its time_limit of 1 s \(by [0-9.]+ s\) "
                                          r"(building|counting|pricing) the "
                                          r"(stages|moves into stages) .*with skips"):
        best_few(layers, Cluster.regular(2, 4), 8, 1, bound=math.inf, edges=edges,
                 time_limit=1.0)
    assert time.monotonic() - start < 1.5

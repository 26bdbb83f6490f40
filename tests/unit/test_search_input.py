"""The search's edge: bad input refused before any work, naming the layer, candidate or
value; numpy's scalars taken; a time limit that holds in every phase, on an instance
built to hold the search (issue 61 item 9), without holding a thread or memory past
it; the default answer never simulates slower than Megatron's or Alpa's choice."""

from __future__ import annotations

import gc
import math
import random
import threading
import time
import tracemalloc

import numpy as np
import pytest

from reshard import Cluster, SearchError
from reshard.planner.estimates import CostCache
from reshard.search import Candidate, Graph, Layer, search_chain, search_graph, simulated
from reshard.search.baselines import uniform

CLUSTER = Cluster.regular(2, 2)


def _ok(name: str = "ok", spec: str = "RR") -> Layer:
    return Layer(name, (8, 8), "float32", {(1, 1): (Candidate("c", 1e-3, spec, spec),)})


def test_duplicate_candidate_names_are_refused_naming_layer_shape_and_name():
    with pytest.raises(SearchError, match=r"layer 'x' has two candidates named 'tp' on "
                                          r"\(1, 2\)"):
        Layer("x", (8, 8), "float32", {(1, 2): (Candidate("tp", 1e-3, "RR", "RR"),
                                                Candidate("tp", 5e-2, "S0R", "S0R"))})
    # the same name on two shapes is two candidates
    Layer("x", (8, 8), "float32", {(1, 1): (Candidate("tp", 1e-3, "RR", "RR"),),
                                   (1, 2): (Candidate("tp", 1e-3, "RR", "RR"),)})


@pytest.mark.parametrize("spec, match", [
    ("bogus", r"candidate 'c': its input layout: bad sharding spec 'bogus'"),
    ("S7R", (r"layer 'x' candidate 'c' on \(1, 1\): its input layout: 'S7R' uses mesh "
            r"axis 7")),
])
def test_specs_that_fit_no_mesh_are_refused_though_no_move_touches_them(spec, match):
    # one layer on one device: no move ever reads its layouts; refused all the same
    with pytest.raises(SearchError, match=match):
        Layer("x", (8, 8), "float32", {(1, 1): (Candidate("c", 1e-3, spec, "RR"),)})


def test_an_output_layout_of_the_wrong_rank_and_an_input_that_fits_no_producer():
    with pytest.raises(SearchError, match=r"layer 'x' candidate 'c' on \(1, 1\) gives its "
                                          r"output as 'RRR' \(rank 3\), but the layer's "
                                          r"output_shape \(8, 8\) has rank 2"):
        Layer("x", (8, 8), "float32", {(1, 1): (Candidate("c", 1e-3, "RR", "RRR"),)})
    flat = Layer("flat", (64,), "float32", {(1, 1): (Candidate("c", 1e-3, "RR", "R"),)})
    with pytest.raises(SearchError, match=r"layer 1 \('ok'\) candidate 'c' on \(1, 1\) takes "
                                          r"its input as 'RR' \(rank 2\), but layer 0 "
                                          r"\('flat'\) gives shape \(64,\)"):
        search_chain([flat, _ok()], CLUSTER, 4)


def test_a_layer_with_no_usable_submesh_is_named():
    wide = Layer("wide", (8, 8), "float32", {(3, 2): (Candidate("c", 1e-3, "RR", "RR"),),
                                             (1, 4): (Candidate("d", 1e-3, "RR", "RR"),)})
    with pytest.raises(SearchError, match=r"layer 1 \('wide'\) has candidates only on "
                                          r"submesh shapes \[\(1, 4\), \(3, 2\)\], none of "
                                          r"which fits the cluster of 2 hosts of 2 devices"):
        search_chain([_ok(), wide, _ok()], CLUSTER, 4)  # refused before any search
    heavy = Layer("heavy", (8, 8), "float32",
                  {(1, 1): (Candidate("c", 1e-3, "RR", "RR", memory=10),)})
    with pytest.raises(SearchError, match=r"layer 2 \('heavy'\): every candidate holds more "
                                          r"than the memory limit of 5 bytes per device"):
        search_chain([_ok(), _ok(), heavy, _ok()], CLUSTER, 4, memory_limit=5)


def test_no_answer_without_a_memory_limit_names_no_limit():
    with pytest.raises(SearchError, match="cannot tile") as err:
        search_chain([_ok()] * 3, CLUSTER, 4)  # 3 one-device layers cannot fill 4 devices
    assert "inf" not in str(err.value) and "memory" not in str(err.value)


def test_numpy_scalars_are_taken_where_numbers_are():
    cand = Candidate("c", np.float32(1e-3), "RR", "RR", np.int64(4))
    assert isinstance(cand.compute, float) and type(cand.memory) is int
    layer = Layer("x", (np.int64(8), 8), "float32", {(1, 1): (cand,),
                                                     (np.int64(2), np.int32(2)): (cand,)})
    assert layer.output_shape == (8, 8) and (2, 2) in layer.candidates
    got = search_chain([layer] * 4, CLUSTER, np.int64(4), memory_limit=np.int64(1 << 20),
                       time_limit=np.float64(60), block=np.int32(1))
    assert got.microbatches == 4
    graph = Graph((layer,) * 3, ((np.int64(0), np.int64(1)), (1, 2), (0, np.int32(2))))
    assert graph.edges == ((0, 1), (0, 2), (1, 2))
    search_graph(graph, Cluster.regular(1, 2), 4, steps=np.int64(10), seed=np.int64(3),
                 beta=np.float32(0.1), few=np.int64(2), method="mcmc")


@pytest.mark.parametrize("kw, match", [
    ({"steps": -1}, r"steps must be an integer >= 0, got -1"),
    ({"beta": math.nan}, r"beta must be a finite number > 0, got nan"),
    ({"beta": 0}, r"beta must be a finite number > 0, got 0"),
    ({"few": 0}, r"few must be an integer >= 1, got 0"),
    ({"seed": 1.5}, r"seed must be an integer, got 1.5"),
])
def test_out_of_range_search_arguments_are_refused(kw, match):
    graph = Graph.chain([_ok()] * 2)
    with pytest.raises(SearchError, match=match):
        search_graph(graph, Cluster.regular(1, 2), 4, method="mcmc", **kw)


@pytest.mark.parametrize("kw, match", [
    ({"microbatches": 2.0}, r"microbatches must be an integer >= 1, got 2.0"),
    ({"memory_limit": -1}, r"memory_limit \(bytes per device\) must be an integer >= 0"),
    ({"memory_limit": 1.5}, r"memory_limit \(bytes per device\) must be an integer"),
    ({"block": 0}, r"block \(layers per block\) must be an integer >= 1"),
    ({"rerank": -1}, r"rerank must be an integer >= 0"),
    ({"time_limit": math.nan}, r"time_limit \(seconds; None: no limit\) must be a finite"),
])
def test_out_of_range_chain_arguments_are_refused(kw, match):
    args = {"microbatches": 4, **kw}
    b = args.pop("microbatches")
    with pytest.raises(SearchError, match=match):
        search_chain([_ok()] * 4, CLUSTER, b, **args)


@pytest.mark.parametrize("edge, match", [
    (("a", 1), (r"edge 0 \('a', 1\): its producer \(a layer index\) must be an integer "
               r">= 0, got 'a'")),
    ((0.5, 1.7), (r"edge 0 \(0.5, 1.7\): its producer \(a layer index\) must be an "
                 r"integer >= 0, got 0.5")),
    ((0, 1, 2), r"edge 0 must be a \(producer, consumer\) pair"),
    ("01", r"edge 0 must be a \(producer, consumer\) pair"),
])
def test_edges_that_are_not_pairs_of_indices_are_refused_not_truncated(edge, match):
    with pytest.raises(SearchError, match=match):
        Graph((_ok(), _ok()), (edge,))


def _hostile(candidates: int, seed: int = 0) -> list[Layer]:
    """16 layers, every candidate a distinct layout pair and weight on every submesh
    shape of a 2 x 4 cluster: Pareto fronts of (time, memory) that grow with every
    layer, and thousands of distinct moves to price (issue 61 item 9: 8.3 s past a 2 s
    limit with 4 candidates; no answer in 120 s with 8)."""
    rng = random.Random(seed)
    specs = ["RR", "S0R", "RS1", "S1R", "RS0", "S01R", "RS01", "S0S1", "S1S0"]
    shapes = [(1, 1), (1, 2), (1, 4), (2, 4)]
    return [Layer(f"l{k}", (1024, 1024), "float32", {
        s: tuple(Candidate(f"c{j}", rng.uniform(1e-4, 1e-2), rng.choice(specs),
                           rng.choice(specs), rng.randrange(1, 1 << 20))
                 for j in range(candidates)) for s in shapes}) for k in range(16)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("candidates", [4, 8])
def test_a_hostile_instance_holds_no_thread_or_memory_past_its_deadline(candidates):
    layers = _hostile(candidates)
    cluster = Cluster.regular(2, 4)
    limit = 1.0
    threads = threading.active_count()
    gc.collect()
    tracemalloc.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(SearchError, match=r"ran past its time_limit of 1 s \(by "):
            search_chain(layers, cluster, 8, memory_limit=1 << 40, time_limit=limit,
                         cache=CostCache())
        late = time.monotonic() - t0 - limit
        _, peak = tracemalloc.get_traced_memory()
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the deadline is met within max(0.5 s, 5%); on a loaded 2-core machine one cold
    # estimate may still be running when it passes: 1.5 s of slack (it was 8.3 s / 120+ s)
    assert late < 1.5, late
    assert threading.active_count() == threads  # nothing left running
    assert peak < 200 << 20, peak  # bytes allocated while it ran
    assert after < 8 << 20, after  # and nothing kept once it raised


def test_the_default_answer_never_simulates_slower_than_the_baselines():
    rng = random.Random(5)
    specs = ["RR", "S0R", "RS1", "S01R"]
    cluster = Cluster.regular(2, 2)
    for _ in range(6):
        n = rng.randint(2, 6)
        layers = [Layer(f"l{k}", (rng.choice([64, 4096]), 256), "float32", {
            s: tuple(Candidate(f"c{j}", rng.uniform(1e-4, 3e-3), rng.choice(specs),
                               rng.choice(specs)) for j in range(rng.randint(1, 3)))
            for s in ((1, 1), (1, 2), (2, 2))}) for k in range(n)]
        b = rng.randint(2, 16)
        cache = CostCache()
        got = search_chain(layers, cluster, b, cache=cache)
        assert got.simulated == pytest.approx(simulated(layers, got, cluster))
        alpa = search_chain(layers, cluster, b, moves="free", cache=cache)
        mega = uniform(layers, cluster, b, cache=cache)
        for base in (alpa, mega):
            assert got.simulated <= simulated(layers, base, cluster) * (1 + 1e-12)
        exact = search_chain(layers, cluster, b, cache=cache, rerank=0)
        assert exact.simulated is None and exact.time <= got.time * (1 + 1e-12)



def test_layers_of_many_kinds_keep_the_megatron_baseline_bounded():
    """16 layers whose candidates are named per layer: 16 kinds of 4 names would be
    4^16 uniform choices; past baselines.MAX_PICKS each kind takes its fastest, so the
    default search (which prices Megatron's choice as a bound) answers within its limit."""
    from reshard.search.baselines import MAX_PICKS

    layers = [Layer(f"l{k}", (64, 64), "float32", {
        (1, 1): tuple(Candidate(f"l{k}.c{j}", 1e-3 * (j + 1), "RR", "RR") for j in range(4)),
        (1, 2): tuple(Candidate(f"l{k}.c{j}", 6e-4 * (j + 1), "S0R", "S0R")
                      for j in range(4))}) for k in range(16)]
    assert MAX_PICKS < 4 ** 16
    got = search_chain(layers, CLUSTER, 8, time_limit=60)
    mega = uniform(layers, CLUSTER, 8)
    assert all(n.endswith(".c0") for s in mega.stages for n in s.choices)  # the fastest
    assert got.simulated <= simulated(layers, mega, CLUSTER) * (1 + 1e-12)

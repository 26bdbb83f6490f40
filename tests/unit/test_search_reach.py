"""Stage options pruned before they are built (reshard.search.reach): every option on a
path of the one-chunk DP (what stagedp keeps of the full set) is still built, on random
chains, caps and memory limits; and the pruning is real (a 32-layer chain on 4 x 4
devices under a tight cap builds a small fraction of the options)."""

from __future__ import annotations

import math
import random

import pytest

from reshard import Cluster, SearchError
from reshard.search import Candidate, Layer, search_chain
from reshard.search.chain import _options
from reshard.search.costs import MoveCosts
from reshard.search.model import Budget
from reshard.search.reach import block_shapes, far, reach
from reshard.search.stagedp import _live

SPECS = ("RR", "S0R", "RS1", "S01R")
SHAPES = ((1, 1), (1, 2), (1, 4), (2, 4), (4, 4))


def _layers(rng, n, shapes):
    return [Layer(f"l{k}", (512, 64), "float32", {
        s: tuple(Candidate(f"c{j}", rng.uniform(1e-4, 4e-3) / (s[0] * s[1]) ** 0.8,
                           rng.choice(SPECS), rng.choice(SPECS), rng.randint(0, 4), 0,
                           rng.randint(0, 2))
                 for j in range(rng.randint(1, 3))) for s in shapes}) for k in range(n)]


def _key(o):
    return (o.first, o.last, o.placement, o.entry, o.exit, o.trail, o.inner, o.memory,
            o.activations)


def test_every_option_on_a_path_is_built():
    rng = random.Random(42)
    checked = 0
    for _ in range(40):
        cluster = rng.choice((Cluster.regular(2, 2), Cluster.regular(2, 4)))
        g = len(cluster.hosts[0])
        shapes = [s for s in SHAPES if s[1] <= g and (s[0] == 1 or s[1] == g)
                  and s[0] <= cluster.num_hosts]
        layers = _layers(rng, rng.randint(2, 9), rng.sample(shapes, rng.randint(1, len(shapes))))
        costs = MoveCosts(cluster)
        limit = rng.choice((math.inf, 8.0, 14.0))
        cap = rng.choice((math.inf, 3e-3, 6e-3, 1.2e-2))
        total = len(cluster.devices)
        every = _options(layers, cluster, costs, limit, Budget(None), cap)
        tiled = _options(layers, cluster, costs, limit, Budget(None), cap, tiled=True)
        live, _ = _live(every, total, len(layers))
        built = {_key(o) for o in tiled}
        assert {_key(o) for o in live} <= built
        assert built <= {_key(o) for o in every}
        # and what is built beyond the live ones is no path's either
        assert {_key(o) for o in _live(tiled, total, len(layers))[0]} == \
            {_key(o) for o in live}
        checked += bool(live)
    assert checked >= 20


def test_far_is_the_lower_bound_stage_and_the_pruning_is_real():
    cands = {(1, 4): (Candidate("a", 1e-3, "RR", "RR", 1),),
             (4, 4): (Candidate("b", 0.3e-3, "RR", "RR", 1),)}
    layers = [Layer(f"l{k}", (512, 64), "float32", cands) for k in range(32)]
    assert far(layers, (1, 4), math.inf, 3.5e-3)[:2] == [2, 3]  # 3 layers of 1 ms fit
    assert far(layers, (1, 4), 2, math.inf)[0] == 1  # 2 bytes: 2 layers of 1
    assert far(layers, (4, 4), math.inf, 1e-4) == [k - 1 for k in range(32)]  # none fits
    cluster = Cluster.regular(4, 4)
    # 32 layers of 1 ms on four (1, 4) stages: 8 each at a cap of 8 ms, nothing else
    r = reach(layers, cluster, [(1, 4), (4, 4)], math.inf, 8e-3)
    assert r.lasts((1, 4), 0, 0) == [7]
    assert r.lasts((1, 4), 8, 4) == [15]
    assert r.lasts((1, 4), 1, 0) == []  # layer 0 would be left out
    costs = MoveCosts(cluster)
    tiled = _options(layers, cluster, costs, math.inf, Budget(None), 8e-3, tiled=True)
    every = _options(layers, cluster, costs, math.inf, Budget(None), 8e-3)
    assert len(tiled) == 4 and len(every) > 100 * len(tiled), (len(tiled), len(every))


def test_blocks_are_built_only_on_shapes_that_can_reach_a_path(monkeypatch):
    """Blocks of 2 layers: the answer with blocks on every shape (block_shapes patched
    to keep all) equals the answer with the pruned shapes, on random chains; and on 32
    layers of 1 ms on (1, 4), 0.3 ms on (4, 4), a cap of 8 ms keeps (1, 4) alone."""
    import reshard.search.chain as chain_mod

    cands = {(1, 4): (Candidate("a", 1e-3, "RR", "RR", 1),),
             (4, 4): (Candidate("b", 0.3e-3, "RR", "RR", 1),)}
    layers = [Layer(f"l{k}", (512, 64), "float32", cands) for k in range(32)]
    assert block_shapes(layers, 2, Cluster.regular(4, 4), math.inf, 8e-3) == {(1, 4)}
    assert block_shapes(layers, 2, Cluster.regular(4, 4), math.inf, 1e-2) == {(1, 4), (4, 4)}
    # the fastest candidate is too heavy: the floors take each least on its own
    mixed = {(1, 4): (Candidate("fast", 1e-3, "RR", "RR", 10), Candidate("light", 1.5e-3, "RR",
                                                                          "RR", 1))}
    two = [Layer(f"m{k}", (512, 64), "float32", mixed) for k in range(32)]
    assert block_shapes(two, 2, Cluster.regular(4, 4), 8, 12e-3) == {(1, 4)}
    got = search_chain(two, Cluster.regular(4, 4), 4, block=2, memory_limit=8, rerank=0)
    assert [s.choices for s in got.stages] == [("light",) * 8] * 4
    rng = random.Random(5)
    for _ in range(12):
        cluster = rng.choice((Cluster.regular(2, 2), Cluster.regular(2, 4)))
        g = len(cluster.hosts[0])
        shapes = [s for s in SHAPES if s[1] <= g and (s[0] == 1 or s[1] == g)
                  and s[0] <= cluster.num_hosts]
        chain = _layers(rng, rng.randint(4, 10), shapes)
        b, limit = rng.randint(2, 16), rng.choice((None, 14))
        kw = {"block": 2, "memory_limit": limit, "rerank": 0}
        try:
            pruned = search_chain(chain, cluster, b, **kw)
        except SearchError:
            continue
        with monkeypatch.context() as m:
            m.setattr(chain_mod, "block_shapes",
                      lambda layers, *a: {s for x in layers for s in x.candidates})
            every = search_chain(chain, cluster, b, **kw)
        assert pruned.time == pytest.approx(every.time, rel=1e-12)

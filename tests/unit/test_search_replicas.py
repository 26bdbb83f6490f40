"""Data-parallel replicas (reshard.search.replicas): the pipeline searched on a
replica's hosts, the gradient all-reduce across replicas priced by reshard and folded
into each candidate's compute, the degree part of the search. On random small
instances the answer equals an independent brute force of the stated objective over
every degree, every split into stages, every submesh sequence and every candidate."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

from reshard import Cluster, Layout, SearchError
from reshard.mesh import DeviceMesh
from reshard.planner.estimates import CostCache, estimate
from reshard.search import Candidate, Layer, Stage, evaluate, search_chain
from reshard.search.replicas import degrees, replica_cluster, search_replicated
from tests.unit._stage_tilings import stage_tilings

CLUSTER = Cluster.regular(2, 2)
SPECS = ("RR", "S0R", "RS1", "S01R")


def _allreduce(cluster, r, shape, grads, cache):
    """Independent of the module: ``grads`` bytes per device summed over the ``r``
    devices at one place in each replica, every device of the submesh at once."""
    if r == 1 or grads == 0:
        return 0.0
    n = shape[1]  # one host's part: hosts of a stage all-reduce in disjoint groups
    stride = len(cluster.devices) // r
    mesh = DeviceMesh((r, n), [k * stride + j for k in range(r) for j in range(n)])
    return estimate((n * -(-grads // 2),), "bfloat16", Layout(mesh, "S1+P0"),
                    Layout(mesh, "S1"), cluster, cache=cache)


def _brute(layers, cluster, b, cache):
    best = math.inf
    for r in (1, 2):
        sub = dataclasses.replace(cluster, hosts=cluster.hosts[:cluster.num_hosts // r])
        mb = -(-b // r)
        for bounds, places in stage_tilings(sub, len(layers), ((1, 1), (1, 2), (2, 2))):
            per = [layers[k].candidates.get(p.shape, ()) for (a, z), p in
                   zip(bounds, places) for k in range(a, z + 1)]
            for picks in itertools.product(*per):
                grown = [dataclasses.replace(c, compute=c.compute + _allreduce(
                    cluster, r, places[i].shape, c.grads, cache) / mb)
                    for i, (a, z) in enumerate(bounds) for c in picks[a:z + 1]]
                lays = [Layer(layers[k].name, layers[k].output_shape, "float32",
                              {places[i].shape: (grown[k],)})
                        for i, (a, z) in enumerate(bounds) for k in range(a, z + 1)]
                stages = [Stage(a, z, p, tuple(c.name for c in grown[a:z + 1]), 0, 0, 0)
                          for (a, z), p in zip(bounds, places)]
                best = min(best, evaluate(lays, stages, sub, mb, "1f1b").time)
    return best


def _instance(rng):
    n = rng.randint(1, 3)
    layers = []
    for k in range(n):
        cands = {s: tuple(Candidate(f"c{j}", rng.uniform(1e-4, 3e-3), rng.choice(SPECS),
                                    rng.choice(SPECS), 0, rng.choice([0, 1 << 20, 64 << 20]))
                          for j in range(rng.randint(1, 2)))
                 for s in ((1, 1), (1, 2), (2, 2)) if s == (1, 1) or rng.random() < 0.7}
        layers.append(Layer(f"l{k}", (rng.choice([64, 2048]), 256), "float32", cands))
    return layers, rng.randint(1, 8)


@pytest.mark.timeout(600)
def test_the_answer_equals_a_brute_force_over_degrees_stages_and_candidates():
    rng = random.Random(63)
    cache = CostCache()
    for _ in range(25):
        layers, b = _instance(rng)
        want = _brute(layers, CLUSTER, b, cache)
        if want == math.inf:
            with pytest.raises(SearchError):
                search_replicated(layers, CLUSTER, b, cache=cache, rerank=0)
            continue
        got = search_replicated(layers, CLUSTER, b, cache=cache, rerank=0)
        assert got.choice.time == pytest.approx(want, rel=1e-9)
        assert len(got.cluster.devices) * got.replicas == len(CLUSTER.devices)


def test_replicas_pay_their_all_reduce_and_win_where_it_is_cheap():
    """One layer on a 2 x 1 cluster: two replicas halve each one's microbatches but
    all-reduce the gradients over the slow network; with small gradients they win, with
    huge ones a single pipeline (no all-reduce) does."""
    cluster = Cluster.regular(2, 1)
    for grads, want in ((1 << 10, 2), (1 << 34, 1)):
        layer = Layer("l", (64, 64), "float32",
                      {(1, 1): (Candidate("c", 1e-2, "RR", "RR", 0, grads),),
                       (2, 1): (Candidate("d", 0.9e-2, "S0R", "S0R", 0, grads),)})
        got = search_replicated([layer], cluster, 16, rerank=0)
        assert got.replicas == want, got.tried
        assert dict(got.tried).keys() == {1, 2}
    assert degrees(Cluster.regular(12, 8)) == (1, 2, 3, 4, 6, 12)
    with pytest.raises(SearchError, match="5 data-parallel replicas do not divide the "
                                          "cluster's 2 hosts"):
        search_replicated([layer], cluster, 16, replicas=[5])
    assert replica_cluster(Cluster.regular(4, 2), 2).hosts == ((0, 1), (2, 3))


def test_one_replica_is_the_chain_search():
    layers, b = _instance(random.Random(1))
    one = search_replicated(layers, CLUSTER, b, replicas=[1], rerank=0)
    assert one.choice == search_chain(layers, CLUSTER, b, rerank=0)

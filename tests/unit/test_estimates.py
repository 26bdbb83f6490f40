"""reshard.estimate_many: each estimate the planner's own (plan(...).estimate()) over
random layouts on clusters with hosts the request does not touch, the same move between
other hosts answered from the cache, a bad request failing alone with its position, and
the cache bounded."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.estimates import CostCache, EstimateError, estimate_many, normal_form
from reshard.planner.values.strategy import Strategy

from ..common import problems

CLUSTERS = (Cluster.preset("dgx-h100", 5, 2),  # two NICs a host: a device's place counts
            Cluster.regular(6, 2, nic_bandwidth=1e9, intra_bandwidth=4e9, latency=2e-5),
            Cluster.from_hosts([[0, 1, 2], [3, 4], [5, 6, 7], [8, 9]], preset="dgx-a100"),
            # ids out of order on their hosts: the normal form keeps places and order
            Cluster.from_hosts([[7, 1], [5, 3], [4, 2], [0, 6]], preset="dgx-h100"))


@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(data=st.data(), which=st.integers(0, len(CLUSTERS) - 1),
       strategy=st.sampled_from(["broadcast", "send_recv", "allgather"]))
def test_every_estimate_is_the_planners_own(data, which, strategy):
    """Within 2% is the promise; the normal form plans the same question, so equal."""
    cluster = CLUSTERS[which]
    shape, dtype, src, dst = data.draw(problems(cluster.devices, max_ndim=2, max_size=6))
    want = reshard.plan(shape, dtype, src, dst, cluster=cluster, strategy=strategy).estimate()
    got = estimate_many([(shape, dtype, src, dst, cluster, strategy)])[0]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_the_same_move_between_other_hosts_is_one_question():
    cluster = Cluster.preset("dgx-h100", 16)
    cache = CostCache()
    reqs = []
    for first in (0, 32, 64):  # three stage boundaries of a pipeline, 4x8 -> 4x8
        a = DeviceMesh((4, 8), range(first, first + 32))
        b = DeviceMesh((4, 8), range(first + 32, first + 64))
        reqs.append(((8192, 4096), "bfloat16", Layout(a, "S0R"), Layout(b, "RS0"), cluster))
    got = estimate_many(reqs, cache=cache)
    assert got[0] == got[1] == got[2] > 0
    assert cache.misses == 4 and cache.hits == 2  # one plan; the others by normal form
    assert estimate_many(reqs, cache=cache) == got
    assert cache.hits == 5  # now by their exact keys
    shifted = normal_form((8192, 4096), "bfloat16", reqs[2][2], reqs[2][3], cluster,
                          Strategy.BROADCAST, None)
    assert shifted.src.mesh.devices == tuple(range(32)) and len(shifted.cluster.hosts) == 8


def test_a_bad_request_fails_alone_with_its_position():
    cluster = Cluster.regular(2, 2)
    a, b = DeviceMesh((2,), [0, 1]), DeviceMesh((2,), [2, 3])
    good = ((8, 8), "float32", Layout(a, "S0R"), Layout(b, "RS0"), cluster)
    reqs = [good, ((8, 8), "float32", Layout(a, "S0R"), "RS0", cluster),
            ((8, 8), "float32", Layout(a, "S0R"), Layout(DeviceMesh((2,), [2, 9]), "RS0"),
             cluster),
            ((8,), "float32", Layout(a, "S0R"), Layout(b, "RS0"), cluster),
            ((8, 8), "bool", Layout(a, "RR+P0"), Layout(b, "RS0"), cluster),
            (1, 2, 3), (*good, "sideways"), good]
    with pytest.raises(EstimateError) as info:
        estimate_many(reqs)
    err = info.value
    assert sorted(err.failures) == [1, 2, 3, 4, 5, 6]
    assert err.estimates[0] == err.estimates[7] > 0
    assert all(math.isnan(err.estimates[i]) for i in err.failures)
    text = str(err)
    for part in ("request 1: ReshardError: the destination layout must be a reshard.Layout",
                 "request 2: ClusterError", "request 3: SpecError", "request 4: PartialError",
                 "and 1 more"):
        assert part in text, part
    assert "valid" in str(err.failures[6])  # the unknown strategy lists the valid ones
    with pytest.raises(reshard.SpecError):
        reshard.estimate((8,), "float32", Layout(a, "S0R"), Layout(b, "RS0"), cluster)


def test_the_cache_is_bounded_in_bytes():
    cluster = Cluster.regular(4, 2)
    cache = CostCache(max_bytes=4_000)
    a, b = DeviceMesh((2,), [0, 1]), DeviceMesh((2,), [4, 5])
    reqs = [((n, 4), "float32", Layout(a, "S0R"), Layout(b, "RS0"), cluster)
            for n in range(1, 60)]
    estimate_many(reqs, cache=cache)
    assert 0 < len(cache) <= 4_000 // 240
    with pytest.raises(reshard.ReshardError, match="max_bytes"):
        CostCache(max_bytes=-1)


def test_sbp_signatures_name_layouts():
    """OneFlow's SBP: S(d) split, B broadcast (replicated), P partial; as a string or a
    sequence, one per mesh axis."""
    from reshard.spec import ShardingSpec

    mesh = DeviceMesh((2, 4), range(8))
    for sbp, want in (("(S(0), B)", "S0R"), ("S(0), B", "S0R"), ("S(0)B", "S0R"),
                      (["S(1)", "P"], "RS0+P1"), ("(B, S(0))", "S1R"), ("S(0)S(1)", "S0S1")):
        got = ShardingSpec.from_sbp(sbp, 2)
        assert Layout(mesh, got).index_map((8, 8)) == Layout(mesh, want).index_map((8, 8))
        assert got.partial == ShardingSpec.parse(want).partial
    with pytest.raises(reshard.SpecError, match="unknown placement"):
        ShardingSpec.from_sbp("(S(0), X)", 2)
    with pytest.raises(reshard.SpecError, match="names no placement"):
        ShardingSpec.from_sbp("()", 2)


def test_the_cache_weighs_the_cluster_its_exact_keys_hold():
    # a cluster with a 4 MiB name in each exact key: a 16 MiB cache keeps at most 3 of
    # them (it counted 16 bytes a device, and kept every one)
    import dataclasses

    from reshard import estimate

    cache = CostCache(16 << 20)
    src = Layout(DeviceMesh((2,)), "S0R")
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "S0R")
    for k in range(8):
        named = dataclasses.replace(Cluster.regular(2, 2), name=f"{k}" + "x" * (4 << 20))
        estimate((64, 8), "float32", src, dst, named, cache=cache)
    assert len(cache) <= 1 + 3  # the normal form's one entry and what fits

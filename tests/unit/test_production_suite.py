"""The production-scale weight-sync suite: real models' parameter counts from their
configs, layouts that build on their clusters, and a plan at the bound within a budget."""

from __future__ import annotations

import pytest

import reshard
from reshard.microbench.suites.production import (
    DEEPSEEK_V3,
    KIMI_K2,
    QWEN3_32B,
    QWEN3_235B,
    production_cases,
    requests,
)
from reshard.planner.schedule.staging import staging_by_device


@pytest.mark.parametrize("model, published", [
    (QWEN3_32B, 32.8e9), (QWEN3_235B, 235e9), (DEEPSEEK_V3, 671e9), (KIMI_K2, 1.03e12)])
def test_parameter_counts_match_the_published_totals(model, published):
    assert abs(model.num_parameters - published) / published < 0.01


@pytest.mark.parametrize("sync", production_cases(), ids=lambda s: s.name)
def test_every_case_builds_on_its_cluster(sync):
    reqs, cluster = requests(sync)
    assert len(reqs) == len(sync.model.parameters())
    used = {d for r in reqs for lay in r[2:4] for d in lay.devices}
    assert used == set(range(sync.devices)) and sync.devices <= len(cluster.devices)
    assert cluster.name == sync.preset


def test_the_dense_sync_plans_at_the_bound_also_within_a_gib():
    sync = next(s for s in production_cases() if s.name == "qwen3-32b")
    reqs, cluster = requests(sync)
    free = reshard.plan_many(reqs, cluster=cluster)
    assert free.estimate() <= 1.10 * free.lower_bound()
    capped = reshard.plan_many(reqs, cluster=cluster, memory_budget=1 << 30)
    assert max(staging_by_device(capped.tasks, capped.tensors).values()) <= 1 << 30
    assert capped.estimate() <= 1.05 * free.estimate()


def test_a_packed_case_moves_attention_in_grouped_coordinates_with_kv_replicated():
    """qwen3-235b-packed: q, k, v as grouped parts; at engine TP8 over 4 kv heads each
    kv head lands on two ranks of every replica (vLLM's qkv_proj), q split 8 ways."""
    sync = next(s for s in production_cases() if s.name == "qwen3-235b-packed-ue8m0")
    reqs, _ = requests(sync)
    names = [n for _, n, _, _ in sync.model.parameters()]
    k = names.index("layers.0.k_proj")
    shape, _, src, dst, cast = reqs[k]
    assert shape == (4, 128, 4096) and cast is not None and cast.scale.value == "block128-ue8m0"
    boxes = dst.boxes(shape)
    replica0 = dst.mesh.devices[:8]
    assert [boxes[d][0] for d in replica0] == [(g, g + 1) for g in range(4) for _ in range(2)]
    q = reqs[names.index("layers.0.q_proj")]
    assert q[0] == (4, 16 * 128, 4096)
    assert len({q[3].boxes(q[0])[d] for d in replica0}) == 8  # each rank its own q heads
    # the trainer side, TP4 over 4 kv heads: one group a rank, no replication
    assert len({src.boxes(shape)[d] for d in src.mesh.devices[:4]}) == 4

"""Data-parallel replicas of a pipeline: the pipeline searched on ``1 / r`` of the
cluster's hosts and replicated ``r`` times, the degree ``r`` part of the search.

With ``r`` replicas each runs ``ceil(B / r)`` of the ``B`` microbatches on its own
hosts (replica ``k`` on hosts ``k H / r`` to ``(k + 1) H / r - 1``, every replica laid
out alike). Once per iteration each stage's weight gradients are all-reduced across
the ``r`` copies of that stage: per layer, the chosen candidate's ``grads`` bytes per
device, summed over the ``r`` devices at the same place in each replica, every device
of the stage at once: priced by reshard as one move (a tensor split over the devices, a
partial sum over the replicas, to the same split with the sum done) on the mesh of the
``r`` copies of one host's part of the stage (its first submesh of that shape): a
stage on ``h`` whole hosts runs ``h`` such groups at once on NICs no other group uses,
so one group's time is the stage's (the cost model has no resource they share). The
objective spreads it over the replica's microbatches, as it does a layer's own
collectives: a candidate's compute grows by its all-reduce over ``ceil(B / r)``
(:func:`replicated_layers`). The objective of a degree is its replica's
(:mod:`reshard.search.objective`), each stage's all-reduce included; the answer is the
degree whose choice is fastest (by the simulator where it re-ranks, else the
objective).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reshard.cluster import Cluster
from reshard.errors import SearchError
from reshard.layout import Layout
from reshard.mesh import DeviceMesh
from reshard.planner.estimates import CostCache, estimate
from reshard.search.chain import RERANK, search_chain
from reshard.search.checks import integer
from reshard.search.model import (
    Budget,
    Candidate,
    Choice,
    Layer,
    Shape,
    check_cluster,
    checked_already,
)

Model = Sequence[Layer] | Callable[[Cluster], Sequence[Layer]]
"""The layers, or a function that builds them for a (replica's) cluster."""


def replica_cluster(cluster: Cluster, replicas: int) -> Cluster:
    """The first ``1 / replicas`` of ``cluster``'s hosts (one replica's)."""
    h = cluster.num_hosts
    if replicas < 1 or h % replicas:
        raise SearchError(f"{replicas} data-parallel replicas do not divide the cluster's "
                          f"{h} hosts; give a divisor of {h}")
    return dataclasses.replace(cluster, hosts=cluster.hosts[:h // replicas],
                               name=f"{cluster.name}/dp{replicas}")


def allreduce_seconds(cluster: Cluster, replicas: int, shape: Shape, grads: int,
                      cache: CostCache) -> float:
    """The all-reduce of ``grads`` bytes per device across ``replicas`` copies of a
    submesh of ``shape`` (module docstring), by reshard's estimate."""
    if replicas == 1 or grads == 0:
        return 0.0
    # a stage on whole hosts all-reduces host by host: each of its hosts with the hosts
    # at the same place in the other replicas, over NICs no other group uses; one such
    # group is the whole move (shape[1] devices per replica)
    n, stride = shape[1], len(cluster.devices) // replicas
    devices = [k * stride + j for k in range(replicas) for j in range(n)]
    mesh = DeviceMesh((replicas, n), devices)
    elems = -(-grads // 2)  # bf16 gradients
    return estimate((n * elems,), "bfloat16", Layout(mesh, "S1+P0"), Layout(mesh, "S1"),
                    cluster, cache=cache)


def replicated_layers(layers: Sequence[Layer], cluster: Cluster, replicas: int,
                      microbatches: int, cache: CostCache, budget: Budget | None = None
                      ) -> list[Layer]:
    """``layers`` with each candidate's compute grown by its share of the all-reduce
    across ``replicas`` (module docstring); ``microbatches``: a replica's."""
    if replicas == 1:
        return list(layers)
    budget = Budget(None) if budget is None else budget
    sub = replica_cluster(cluster, replicas)
    done: dict[int, dict[Shape, tuple[Candidate, ...]]] = {}
    out = []
    for layer in layers:
        key = id(layer.candidates)
        if key not in done:
            cands: dict[Shape, tuple[Candidate, ...]] = {}
            for shape, cs in layer.candidates.items():
                if shape[0] > sub.num_hosts:
                    continue
                budget.check("pricing the all-reduces across {} replicas (on {})",
                             replicas, shape)
                cands[shape] = tuple(checked_already(
                    Candidate, name=c.name, input=c.input, output=c.output,
                    memory=c.memory, grads=c.grads, activations=c.activations,
                    compute=c.compute + allreduce_seconds(cluster, replicas, shape,
                                                          c.grads, cache) / microbatches)
                    for c in cs)
            done[key] = cands
        out.append(checked_already(Layer, name=layer.name, output_shape=layer.output_shape,
                                   dtype=layer.dtype, candidates=done[key]))
    return out


@dataclass(frozen=True)
class Replicated:
    """A search's answer with data-parallel replicas.

    Attributes:
        replicas: the data-parallel degree ``r``.
        cluster: one replica's hosts (the first ``1 / r``).
        layers: the layers as searched (each candidate's all-reduce across the replicas
            folded into its compute).
        choice: one replica's stages on ``cluster``, ``ceil(B / r)`` microbatches.
        tried: per degree tried, its choice's time (simulated where re-ranked) or the
            reason it has none.
    """

    replicas: int
    cluster: Cluster
    layers: tuple[Layer, ...]
    choice: Choice
    tried: tuple[tuple[int, float | str], ...]

    @property
    def time(self) -> float:
        """The iteration time: the replica's (simulated where re-ranked)."""
        return self.choice.time if self.choice.simulated is None else self.choice.simulated


def degrees(cluster: Cluster) -> tuple[int, ...]:
    """Every data-parallel degree of whole hosts: the divisors of the host count."""
    h = cluster.num_hosts
    return tuple(r for r in range(1, h + 1) if h % r == 0)


def search_replicated(model: Model, cluster: Cluster, microbatches: int, *,
                      replicas: Sequence[int] | None = None, schedule: str = "1f1b",
                      memory_limit: int | None = None, cache: CostCache | None = None,
                      block: int | None = None, time_limit: float | Budget | None = None,
                      rerank: int = RERANK, chunks: int | None = None) -> Replicated:
    """The data-parallel degree, and one replica's stages, submeshes and candidates
    (module docstring; :func:`reshard.search.search_chain` for the rest).

    Args:
        model: the layers (their candidates on the submesh shapes of one replica's
            hosts), or a function building them for a replica's cluster.
        replicas: the degrees to try (default :func:`degrees`: every divisor of the
            host count), each dividing the host count.
        Others: as :func:`reshard.search.search_chain`'s; ``time_limit`` covers every
            degree; ``microbatches`` is the iteration's, split over the replicas.

    Raises:
        SearchError: as :func:`reshard.search.search_chain`'s; a degree that divides no
            host count; no degree with an answer (each one's reason given).
    """
    budget = Budget.of(time_limit)
    b = integer(microbatches, "microbatches", 1)
    if not isinstance(cluster, Cluster):
        raise SearchError(f"cluster must be a reshard.Cluster, got {type(cluster).__name__}")
    check_cluster(cluster)
    tries = degrees(cluster) if replicas is None else tuple(
        integer(r, "replicas (a data-parallel degree)", 1) for r in replicas)
    for r in tries:
        replica_cluster(cluster, r)  # refused before any search
    cache = CostCache() if cache is None else cache
    best: Replicated | None = None
    tried: list[tuple[int, float | str]] = []
    for r in tries:
        sub, mb = replica_cluster(cluster, r), math.ceil(b / r)
        base = model(sub) if callable(model) else model
        try:
            layers = replicated_layers(base, cluster, r, mb, cache, budget)
            got = search_chain(layers, sub, mb, schedule=schedule, memory_limit=memory_limit,
                               cache=cache, block=block, time_limit=budget, rerank=rerank,
                               chunks=chunks)
        except SearchError as e:
            if "time_limit" in str(e):
                raise
            tried.append((r, str(e)))
            continue
        mine = Replicated(r, sub, tuple(layers), got, ())
        tried.append((r, mine.time))
        if best is None or mine.time < best.time:
            best = mine
    if best is None:
        raise SearchError("no data-parallel degree has an answer: " + "; ".join(
            f"{r}: {why}" for r, why in tried))
    return dataclasses.replace(best, tried=tuple(tried))


__all__ = ["Model", "Replicated", "allreduce_seconds", "degrees", "replica_cluster",
           "replicated_layers", "search_replicated"]

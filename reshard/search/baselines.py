"""The baselines a stage search is measured against.

* :func:`uniform`: Megatron's way: ``p`` stages of equal layer count (the last takes
  the rest) on equal submeshes, one candidate on every layer of a kind (layers with
  the same candidate names: a MoE model's dense and expert layers are two kinds); the
  best ``p`` and candidates by the real objective (as a user tuning Megatron's ``--pipeline-model-
  parallel-size`` would).
* Alpa's way is :func:`reshard.search.search_chain` with ``moves="free"``: the same DP
  choosing as if moves cost nothing, its answer priced with the moves it really makes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

from reshard.cluster import Cluster
from reshard.errors import SearchError
from reshard.planner.estimates import CostCache
from reshard.search.costs import MoveCosts
from reshard.search.model import Budget, Choice, Layer, Stage, placements
from reshard.search.objective import evaluate


def uniform(layers: Sequence[Layer], cluster: Cluster, microbatches: int,
            schedule: str = "1f1b", cache: CostCache | None = None,
            memory_limit: int | None = None, *, costs: MoveCosts | None = None,
            time_limit: float | Budget | None = None,
            edges: Sequence[tuple[int, int]] | None = None) -> Choice:
    """The best Megatron-style choice (module docstring) by the real objective, among
    those whose every stage holds at most ``memory_limit`` bytes per device (``costs``:
    priced moves to share; ``time_limit``: as the search's; ``edges``: as
    :func:`reshard.search.evaluate` takes them)."""
    budget = Budget.of(time_limit)
    limit = math.inf if memory_limit is None else memory_limit
    if costs is None or costs.free:
        costs = MoveCosts(cluster, cache=CostCache() if cache is None else cache)
    total, n = len(cluster.devices), len(layers)
    best: Choice | None = None
    shapes = sorted({s for layer in layers for s in layer.candidates})
    for shape in shapes:
        size = shape[0] * shape[1]
        if total % size:
            continue
        p = total // size
        if p > n:
            continue
        places = [placements(cluster, shape, k * size) for k in range(p)]
        if any(pl is None for pl in places):
            continue
        # layers of one kind (the same candidate names) take one candidate: a name per kind
        kinds = sorted({tuple(sorted(c.name for c in layer.candidates.get(shape, ())))
                        for layer in layers})
        if any(not kind for kind in kinds):
            continue
        per = math.ceil(n / p)
        for picks in _picks(layers, shape, kinds):
            pick = dict(zip(kinds, picks))
            names = [pick[tuple(sorted(c.name for c in layer.candidates[shape]))]
                     for layer in layers]
            stages = []
            for k, pl in enumerate(places):
                first, last = k * per, min(n, (k + 1) * per) - 1
                if first > last or pl is None:
                    break
                stages.append(Stage(first, last, pl, tuple(names[first:last + 1]), 0, 0, 0))
            if len(stages) != p or stages[-1].last != n - 1 or any(
                    sum(next(c.memory for c in layers[k].candidates[shape]
                             if c.name == names[k])
                        for k in range(st.first, st.last + 1)) > limit for st in stages):
                continue
            budget.check("choosing Megatron's uniform baseline (on {})", shape)
            got = evaluate(layers, stages, cluster, microbatches, schedule, costs, edges)
            if best is None or got.time < best.time:
                best = got
    if best is None:
        raise SearchError("no uniform choice: no submesh shape divides the cluster into "
                          "stages whose layers all have candidates on it, within the "
                          "memory limit")
    return best


MAX_PICKS = 4096
"""The most combinations of one candidate per kind of layer :func:`uniform` tries on a
submesh shape; past it, each kind takes its least-compute candidate (as a user tuning
one kind at a time would start)."""


def _picks(layers: Sequence[Layer], shape: tuple[int, int],
           kinds: list[tuple[str, ...]]) -> Iterator[tuple[str, ...]]:
    """A name per kind: every combination, or past :data:`MAX_PICKS` the fastest each."""
    if math.prod(len(kind) for kind in kinds) <= MAX_PICKS:
        yield from itertools.product(*kinds)
        return
    fastest: dict[tuple[str, ...], str] = {}
    for layer in layers:
        cands = layer.candidates[shape]
        kind = tuple(sorted(c.name for c in cands))
        fastest.setdefault(kind, min(cands, key=lambda c: (c.compute, c.name)).name)
    yield tuple(fastest[kind] for kind in kinds)


__all__ = ["MAX_PICKS", "uniform"]

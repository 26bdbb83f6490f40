"""The baselines a stage search is measured against.

* :func:`uniform`: Megatron's way: ``p`` stages of equal layer count (the last takes
  the rest; with virtual stages ``v p`` pieces, placed as the schedule places them) on
  equal submeshes, one candidate on every layer of a kind (layers with
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
from reshard.search.kinds import SearchSchedule, parse
from reshard.search.memory import Orders, in_flight
from reshard.search.model import (
    Budget,
    Choice,
    Layer,
    Placement,
    Shape,
    Stage,
    devices,
    placements,
)
from reshard.search.objective import evaluate
from reshard.search.virtual import piece_submeshes


def uniform(layers: Sequence[Layer], cluster: Cluster, microbatches: int,
            schedule: str = "1f1b", cache: CostCache | None = None,
            memory_limit: int | None = None, *, costs: MoveCosts | None = None,
            time_limit: float | Budget | None = None,
            edges: Sequence[tuple[int, int]] | None = None,
            chunks: int | None = None, orders: Orders | None = None) -> Choice:
    """The best Megatron-style choice (module docstring) by the real objective, among
    those whose every stage holds at most ``memory_limit`` bytes per device as the
    schedule holds them (:mod:`reshard.search.memory`; with virtual stages each piece
    ``1 / chunks`` of it, as the search holds them) (``costs``: priced moves to share;
    ``time_limit``: as the search's; ``edges``: as :func:`reshard.search.evaluate`
    takes them; ``chunks``: pieces per submesh under interleaved 1F1B, default 2;
    ``orders``: the search's pipeline schedules, kept)."""
    budget = Budget.of(time_limit)
    sched = parse(SearchSchedule, schedule, "schedule")
    v = sched.chunks(chunks)
    limit = (math.inf if memory_limit is None else memory_limit) / v
    if costs is None or costs.free:
        costs = MoveCosts(cluster, cache=CostCache() if cache is None else cache)
    best: Choice | None = None
    for shape in sorted({s for layer in layers for s in layer.candidates}):
        kinds = sorted({tuple(sorted(c.name for c in layer.candidates.get(shape, ())))
                        for layer in layers})
        cut = _cut(layers, cluster, shape, sched, v, microbatches, orders)
        if cut is None or any(not kind for kind in kinds):
            continue
        bounds, places, counts = cut
        for picks in _picks(layers, shape, kinds):
            pick = dict(zip(kinds, picks))
            names = [pick[tuple(sorted(c.name for c in layer.candidates[shape]))]
                     for layer in layers]
            if any(_held(layers, shape, names, a, z, n) > limit
                   for (a, z), n in zip(bounds, counts)):
                continue
            stages = [Stage(a, z, pl, tuple(names[a:z + 1]), 0, 0, 0)
                      for (a, z), pl in zip(bounds, places)]
            budget.check("choosing Megatron's uniform baseline (on {})", shape)
            got = evaluate(layers, stages, cluster, microbatches, sched, costs, edges, v)
            if best is None or got.time < best.time:
                best = got
    if best is None:
        raise SearchError("no uniform choice: no submesh shape divides the cluster into "
                          "stages whose layers all have candidates on it, within the "
                          "memory limit")
    return best


def _cut(layers: Sequence[Layer], cluster: Cluster, shape: Shape, schedule: SearchSchedule,
         chunks: int, microbatches: int, orders: Orders | None = None
         ) -> tuple[list[tuple[int, int]], list[Placement], tuple[int, ...]] | None:
    """Equal pieces of ``layers`` (the last takes the rest) on the submeshes of
    ``shape`` tiling ``cluster``, as the schedule places them: each piece's (first,
    last) layer, its submesh and its in-flight count; None where they do not fit."""
    n, total, size = len(layers), devices(cluster), shape[0] * shape[1]
    if total % size:
        return None
    p = total // size
    pieces = p * chunks
    if pieces > n or microbatches < schedule.traits.fewest * p:
        return None
    subs = [placements(cluster, shape, k * size) for k in range(p)]
    per = math.ceil(n / pieces)
    bounds = [(k * per, min(n, (k + 1) * per) - 1) for k in range(pieces)]
    if any(pl is None for pl in subs) or any(a > z for a, z in bounds):
        return None
    places = [subs[k] for k in piece_submeshes(schedule, p, chunks)]
    return bounds, places, in_flight(schedule, p, chunks, microbatches,  # type: ignore[return-value]
                                     orders)


def _held(layers: Sequence[Layer], shape: Shape, names: Sequence[str], first: int, last: int,
          in_flight: int) -> int:
    """Bytes per device of layers ``first..last`` running the candidates ``names`` on a
    submesh of ``shape`` with ``in_flight`` microbatches' activations."""
    out = 0
    for k in range(first, last + 1):
        c = next(c for c in layers[k].candidates[shape] if c.name == names[k])
        out += c.memory + in_flight * c.activations
    return out


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

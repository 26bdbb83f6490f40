"""The objective a stage search minimises, and any choice priced by it.

A stage ``s`` spends per microbatch ``c_s`` (its layers' compute and the moves between
its own layers) and ``m_s`` (its input activations moved from earlier stages, and their
gradients moved back: reshard's estimates, :mod:`reshard.search.costs`). With ``B``
microbatches

* ``1f1b`` (the moves on the critical path): ``T = sum_s (c_s + m_s) + (B - 1) * max_s
  (c_s + m_s)``;
* ``eager-1f1b`` (a stage sends its next activation while it computes, so a move hides
  behind compute): ``T = sum_s (c_s + m_s) + (B - 1) * max_s max(c_s, m_s)``.

An edge (a producer's output taken by a consumer) inside a stage is an inner move of
it; one from an earlier stage (a skip connection may cross several) a move in of the
stage it enters.
"""

from __future__ import annotations

from collections.abc import Sequence

from reshard.cluster import Cluster
from reshard.errors import SearchError
from reshard.search.costs import MoveCosts
from reshard.search.model import Candidate, Choice, Layer, Shape, Stage

SCHEDULES = ("1f1b", "eager-1f1b")
"""The schedules the objective models (module docstring)."""

MOVES = ("priced", "free")
"""How moves are priced while choosing."""


def period(schedule: str, inner: float, move_in: float) -> float:
    """A stage's time per microbatch in the steady state of ``schedule``."""
    return inner + move_in if schedule == "1f1b" else max(inner, move_in)


def objective(stages: Sequence[Stage], microbatches: int, schedule: str) -> Choice:
    """The objective's iteration time of ``stages`` (module docstring) and its
    breakdown: the bottleneck stage's compute and exposed moves over ``B``
    microbatches, and the rest (fill and drain)."""
    sched = parse_choice_name(schedule, SCHEDULES, "schedule")
    periods = [period(sched, s.compute + s.inner, s.move_in) for s in stages]
    total = sum(s.compute + s.inner + s.move_in for s in stages)
    slow = max(range(len(stages)), key=lambda k: periods[k])
    time = total + (microbatches - 1) * periods[slow]
    compute = microbatches * stages[slow].compute
    transfer = microbatches * (periods[slow] - stages[slow].compute)
    return Choice(tuple(stages), microbatches, sched, time, compute, transfer,
                  time - compute - transfer)


def parse_choice_name(value: str, valid: Sequence[str], what: str) -> str:
    """``value`` if it is one of ``valid``; else a SearchError listing them."""
    if value not in valid:
        raise SearchError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")
    return value


def evaluate(layers: Sequence[Layer], stages: Sequence[Stage], cluster: Cluster,
             microbatches: int, schedule: str = "1f1b",
             costs: MoveCosts | None = None,
             edges: Sequence[tuple[int, int]] | None = None) -> Choice:
    """The objective of ``stages`` with every move priced by reshard (their recorded
    ``inner`` and ``move_in`` recomputed: a choice made with ``moves="free"`` gets its
    real cost). ``edges``: which layer's output each layer takes (``(producer,
    consumer)`` pairs, :class:`reshard.search.Graph`); default the chain's."""
    if costs is None or costs.free:
        costs = MoveCosts(cluster) if costs is None else MoveCosts(cluster, False, costs.cache)
    links = chain_edges(len(layers)) if edges is None else edges
    return objective(price(layers, links, stages, named_candidates(layers, stages), costs),
                     microbatches, schedule)


def named_candidates(layers: Sequence[Layer], stages: Sequence[Stage]) -> list[Candidate]:
    """Per layer, the candidate its stage's ``choices`` name on the stage's submesh."""
    return [_named(layers[k], st.placement.shape, n)
            for st in stages for k, n in zip(range(st.first, st.last + 1), st.choices)]


def stage_index(stages: Sequence[Stage]) -> list[int]:
    """Per layer, the index of the stage that runs it."""
    return [i for i, st in enumerate(stages) for _ in range(st.first, st.last + 1)]


def chain_edges(n: int) -> tuple[tuple[int, int], ...]:
    """A chain's edges: each layer takes the one before's output."""
    return tuple((k, k + 1) for k in range(n - 1))


def price(layers: Sequence[Layer], edges: Sequence[tuple[int, int]],
          stages: Sequence[Stage], cands: Sequence[Candidate], costs: MoveCosts,
          stage_of: Sequence[int] | None = None) -> list[Stage]:
    """``stages`` with layer ``k`` running ``cands[k]``, their compute and moves priced:
    an edge inside a stage is an inner move of it, one from an earlier stage a move in
    of the stage it enters (``stage_of``: :func:`stage_index` of ``stages``, where the
    caller prices them many times)."""
    stage_of = stage_index(stages) if stage_of is None else stage_of
    inner = [0.0] * len(stages)
    moved = [0.0] * len(stages)
    for u, v in edges:
        su, sv = stage_of[u], stage_of[v]
        m = costs.move(layers[u].output_shape, layers[u].dtype, stages[su].placement,
                       cands[u].output, stages[sv].placement, cands[v].input)
        if su == sv:
            inner[sv] += m
        else:
            moved[sv] += m
    return [Stage(st.first, st.last, st.placement,
                  tuple(c.name for c in cands[st.first:st.last + 1]),
                  sum(c.compute for c in cands[st.first:st.last + 1]), inner[i], moved[i])
            for i, st in enumerate(stages)]


def _named(layer: Layer, shape: Shape, name: str) -> Candidate:
    for c in layer.candidates.get(shape, ()):
        if c.name == name:
            return c
    raise SearchError(f"layer {layer.name!r} has no candidate {name!r} on a {shape} submesh")


__all__ = ["MOVES", "SCHEDULES", "chain_edges", "evaluate", "named_candidates", "objective",
           "parse_choice_name", "period", "price", "stage_index"]

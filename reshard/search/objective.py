"""The objective a stage search minimises, and any choice priced by it.

A choice cuts the chain of layers into pieces (stages) in pipeline order: ``p``
submeshes each hold ``v`` pieces (``v = 1`` for 1F1B and eager 1F1B; interleaved 1F1B
puts piece ``j`` on submesh ``j mod p``; ZB-V and DualPipeV put pieces ``s`` and
``2 p - 1 - s`` on submesh ``s``, a V). A piece ``j`` spends per microbatch ``c_j`` (its
layers' compute and the moves between its own layers) and ``m_j`` (its input
activations moved from earlier pieces, and their gradients moved back: reshard's
estimates, :mod:`reshard.search.costs`; a move between two pieces of one submesh is
priced too, on that submesh). Its *period* is ``t_j = c_j + m_j`` (the moves on the
critical path), or ``max(c_j, m_j)`` under eager 1F1B (a stage sends its next
activation while it computes, so a move hides behind compute). With ``B``
microbatches, ``S = sum_j (c_j + m_j)`` and ``t = max_j t_j``::

    T = max(S + (B - 1) t,  S / v + (B v - 1) t)

With ``v = 1`` both terms are 1F1B's ``sum_s (c_s + m_s) + (B - 1) max_s t_s``. With
``v`` pieces per submesh of equal periods ``t`` and moves free, ``S = v p t`` and ``T =
max((v p + B - 1) t, (B v + p - 1) t)``: the pipeline simulator's interleaved 1F1B to
the digit (``tests/unit/test_search_virtual.py``: every ``p <= 4``, ``v <= 3``, ``B <=
16``); ZB-V and DualPipeV simulate up to ``(p - 1) t`` shorter (their zero-bubble
orders fill part of the fill and drain). With pieces of unequal periods the slowest
piece stands for its submesh (``v t`` bounds a submesh's work per microbatch), and the
simulator's time is within a few percent of ``T`` either way (the test measures the
band on random pieces and moves).

An edge (a producer's output taken by a consumer) inside a piece is an inner move of
it; one from an earlier piece (a skip connection may cross several) a move in of the
piece it enters.
"""

from __future__ import annotations

from collections.abc import Sequence

from reshard.cluster import Cluster
from reshard.errors import SearchError
from reshard.search.costs import MoveCosts
from reshard.search.kinds import MOVES, TRAITS, SearchSchedule, parse
from reshard.search.model import Candidate, Choice, Layer, Shape, Stage

SCHEDULES = tuple(s.value for s in SearchSchedule)
"""The schedules the objective models, by name (module docstring; the old name of
:data:`reshard.search.kinds.SEARCH_SCHEDULES`)."""


def period(schedule: str, inner: float, move_in: float) -> float:
    """A piece's time per microbatch in the steady state of ``schedule`` (a
    :class:`SearchSchedule` or its name)."""
    return max(inner, move_in) if TRAITS[schedule].eager else inner + move_in  # type: ignore[index]


def total(pieces_sum: float, slowest: float, microbatches: int, chunks: int) -> float:
    """The objective ``T`` of pieces whose times sum to ``pieces_sum`` and whose
    slowest period is ``slowest`` (module docstring); increasing in both."""
    b = microbatches
    return max(pieces_sum + (b - 1) * slowest,
               pieces_sum / chunks + (b * chunks - 1) * slowest)


def objective(stages: Sequence[Stage], microbatches: int, schedule: str,
              chunks: int | None = None) -> Choice:
    """The objective's iteration time of ``stages`` (pieces in pipeline order, module
    docstring; ``chunks``: pieces per submesh, the schedule's own by default) and its
    breakdown: the slowest piece's compute and exposed moves over its ``B v`` runs, and
    the rest (fill and drain)."""
    sched = parse(SearchSchedule, schedule, "schedule")
    v = sched.chunks(chunks)
    periods = [period(sched, s.compute + s.inner, s.move_in) for s in stages]
    slow = max(range(len(stages)), key=lambda k: periods[k])
    time = total(sum(s.compute + s.inner + s.move_in for s in stages), periods[slow],
                 microbatches, v)
    runs = microbatches * v
    compute = runs * stages[slow].compute
    transfer = runs * (periods[slow] - stages[slow].compute)
    return Choice(tuple(stages), microbatches, sched, time, compute, transfer,
                  time - compute - transfer, None, v)


def parse_choice_name(value: str, valid: Sequence[str], what: str) -> str:
    """``value`` if it is one of ``valid``; else a SearchError listing them (kept for
    callers of the old string tuples; the search parses :mod:`reshard.search.kinds`)."""
    if value not in valid:
        raise SearchError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")
    return value


def evaluate(layers: Sequence[Layer], stages: Sequence[Stage], cluster: Cluster,
             microbatches: int, schedule: str = "1f1b",
             costs: MoveCosts | None = None,
             edges: Sequence[tuple[int, int]] | None = None,
             chunks: int | None = None) -> Choice:
    """The objective of ``stages`` with every move priced by reshard (their recorded
    ``inner`` and ``move_in`` recomputed: a choice made with ``moves="free"`` gets its
    real cost). ``edges``: which layer's output each layer takes (``(producer,
    consumer)`` pairs, :class:`reshard.search.Graph`); default the chain's. ``chunks``:
    pieces per submesh, as :func:`objective` takes it."""
    if costs is None or costs.free:
        costs = MoveCosts(cluster) if costs is None else MoveCosts(cluster, False, costs.cache)
    links = chain_edges(len(layers)) if edges is None else edges
    return objective(price(layers, links, stages, named_candidates(layers, stages), costs),
                     microbatches, schedule, chunks)


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
           "parse_choice_name", "period", "price", "stage_index", "total"]

"""A model as a DAG (skip connections): its layouts at fixed stages by coordinate
descent (AutoDDL's way), started from the chain DP's choice, or by MCMC (FlexFlow's).

A :class:`Graph` is its layers in a topological order and its edges ``(producer,
consumer)``: the consumer takes the producer's output activation, in the consumer's
candidate's input layout, and sends the gradient back. Stages are runs of consecutive
layers of that order, so every edge goes forward or stays in a stage. The objective is
the chain's (:mod:`reshard.search.chain`) with every edge priced: an edge inside a
stage adds to that stage's inner time, one from an earlier stage (a skip connection
may cross several) to the move in of the stage it enters.

:func:`search_graph` takes the stage DP's best few stage choices of the layers in
order (every edge priced where the stages are chosen, :mod:`reshard.search.skips`; a
graph too wide for that: the edges between consecutive layers priced, the skip
connections not), and at each choice's stages chooses the layers' candidates on the
graph's objective:

* ``method="descent"`` (AutoDDL): change one layer's candidate, or two layers joined
  by an edge together, to the best with the others fixed; repeat until no change
  lowers the objective (a local optimum; the seed is the chain DP's);
* ``method="mcmc"`` (FlexFlow): from the same seed, ``steps`` random changes of one
  layer's candidate, each kept with probability ``exp(-(new - old) / (beta * old))``
  (always when no worse), seeded; the best seen is the answer.

The baselines' choices (Alpa's moves-free one and Megatron's uniform one, priced on the
graph) are refined too. By default the pipeline simulator then picks the answer among
the refined choices and the baselines' own (``rerank``), so it never simulates slower
than either; with ``rerank=False`` the least objective is the answer.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reshard.cluster import Cluster
from reshard.errors import SearchError
from reshard.planner.estimates import CostCache
from reshard.search.baselines import uniform
from reshard.search.chain import best_few, check_layers, search_chain
from reshard.search.checks import integer, real
from reshard.search.costs import MoveCosts
from reshard.search.kinds import METHODS, Method, SearchSchedule, parse
from reshard.search.memory import Orders, in_flight
from reshard.search.model import Budget, Candidate, Choice, Layer, Stage
from reshard.search.objective import (
    chain_edges,
    evaluate,
    named_candidates,
    objective,
    price,
    stage_index,
)
from reshard.search.simulated import rerank as rerank_choices
from reshard.spec import ShardingSpec


@dataclass(frozen=True)
class Graph:
    """Layers in a topological order and the edges between them.

    Attributes:
        layers: every layer, each after all the layers it takes an output from.
        edges: ``(producer, consumer)`` index pairs; a consumer takes each producer's
            output (``output_shape``, ``dtype``) in its candidate's ``input`` layout.

    Raises:
        SearchError: an edge names no layer, joins a layer to itself or goes round a
            cycle; the layers are not in a topological order (the message gives one);
            a consumer's input layout does not fit the rank of a producer's output.
    """

    layers: tuple[Layer, ...]
    edges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "edges", tuple(sorted({_edge(k, e)
                                                        for k, e in enumerate(self.edges)})))
        n = len(self.layers)
        for u, v in self.edges:
            if not (0 <= u < n and 0 <= v < n):
                raise SearchError(f"edge ({u}, {v}) names no layer: there are {n}")
            if u == v:
                raise SearchError(f"edge ({u}, {v}) joins layer {u} "
                                  f"({self.layers[u].name!r}) to itself")
        backward = [(u, v) for u, v in self.edges if u > v]
        if backward:
            cycle = _cycle(n, self.edges)
            if cycle:
                raise SearchError("the graph has a cycle: " + " -> ".join(
                    f"{k} ({self.layers[k].name!r})" for k in cycle))
            raise SearchError(f"edge {backward[0]} goes back: list the layers in a "
                              f"topological order, e.g. {_order(n, self.edges)}")
        for u, v in self.edges:
            rank = len(self.layers[u].output_shape)
            for shape, cands in self.layers[v].candidates.items():
                for c in cands:
                    want = ShardingSpec.parse(c.input).ndim
                    if want != rank:
                        raise SearchError(
                            f"edge ({u}, {v}): layer {v} ({self.layers[v].name!r}) candidate "
                            f"{c.name!r} on {shape} takes its input as {c.input!r} (rank "
                            f"{want}), but layer {u} ({self.layers[u].name!r}) gives shape "
                            f"{self.layers[u].output_shape} (rank {rank})")

    @classmethod
    def chain(cls, layers: Sequence[Layer]) -> Graph:
        """Each layer taking the one before's output."""
        return cls(tuple(layers), chain_edges(len(layers)))


def _edge(k: int, value: object) -> tuple[int, int]:
    """Edge ``k`` as a pair of layer indices (integers: numpy's too; never a float
    truncated or a string)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise SearchError(f"edge {k} must be a (producer, consumer) pair of layer indices, "
                          f"got {value!r:.80}")
    u, v = value
    return (integer(u, f"edge {k} {tuple(value)!r}: its producer (a layer index)", 0),
            integer(v, f"edge {k} {tuple(value)!r}: its consumer (a layer index)", 0))


def _cycle(n: int, edges: Sequence[tuple[int, int]]) -> list[int]:
    """One cycle of the graph as its layers (the first again at the end), or []."""
    out: dict[int, list[int]] = {}
    for u, v in edges:
        out.setdefault(u, []).append(v)
    state = [0] * n  # 0 new, 1 on the path, 2 done
    path: list[int] = []

    def visit(u: int) -> list[int]:
        state[u] = 1
        path.append(u)
        for v in out.get(u, ()):
            if state[v] == 1:
                return [*path[path.index(v):], v]
            if state[v] == 0:
                got = visit(v)
                if got:
                    return got
        path.pop()
        state[u] = 2
        return []

    for k in range(n):
        if state[k] == 0:
            got = visit(k)
            if got:
                return got
    return []


def _order(n: int, edges: Sequence[tuple[int, int]]) -> list[int]:
    """A topological order of an acyclic graph (Kahn's, least index first)."""
    need = [0] * n
    for _, v in edges:
        need[v] += 1
    ready = [k for k in range(n) if need[k] == 0]
    order = []
    while ready:
        u = min(ready)
        ready.remove(u)
        order.append(u)
        for a, b in edges:
            if a == u:
                need[b] -= 1
                if need[b] == 0:
                    ready.append(b)
    return order


def evaluate_graph(graph: Graph, stages: Sequence[Stage], cluster: Cluster,
                   microbatches: int, schedule: str = "1f1b",
                   costs: MoveCosts | None = None, chunks: int | None = None) -> Choice:
    """The objective of ``stages`` (their layers' candidates by name) on ``graph``, every
    edge priced by reshard (``chunks``: pieces per submesh, as
    :func:`reshard.search.evaluate` takes it)."""
    return evaluate(graph.layers, stages, cluster, microbatches, schedule, costs,
                    edges=graph.edges, chunks=chunks)


class _Layouts:
    """The objective of candidate choices at fixed stages (pieces, ``chunks`` per
    submesh), and their memory as the schedule holds it (each piece within ``1 /
    chunks`` of the limit, as the stage DP holds it)."""

    def __init__(self, graph: Graph, stages: Sequence[Stage], microbatches: int,
                 schedule: str, costs: MoveCosts, limit: float, chunks: int = 1,
                 orders: Orders | None = None) -> None:
        self.graph, self.stages, self.costs = graph, list(stages), costs
        self.microbatches, self.schedule, self.chunks = microbatches, schedule, chunks
        self.limit = limit / chunks
        self.options: list[tuple[Candidate, ...]] = [
            tuple(graph.layers[k].candidates.get(st.placement.shape, ()))
            for st in stages for k in range(st.first, st.last + 1)]
        self.stage_of = stage_index(stages)  # priced many times: derived once
        self.held = in_flight(SearchSchedule(schedule), len(stages) // chunks, chunks,
                              microbatches, orders)

    def time(self, picks: Sequence[Candidate]) -> float:
        """The objective, or inf where a stage holds more than the limit."""
        for st, n in zip(self.stages, self.held):
            if sum(c.memory + n * c.activations
                   for c in picks[st.first:st.last + 1]) > self.limit:
                return math.inf
        return self.choice(picks).time

    def choice(self, picks: Sequence[Candidate]) -> Choice:
        """The priced choice."""
        return objective(price(self.graph.layers, self.graph.edges, self.stages, picks,
                               self.costs, self.stage_of), self.microbatches, self.schedule,
                         self.chunks)


def _descent(lay: _Layouts, picks: list[Candidate], budget: Budget) -> list[Candidate]:
    """Coordinate descent (module docstring): single layers, then edges' pairs."""
    best = lay.time(picks)
    groups: list[tuple[int, ...]] = [(k,) for k in range(len(picks))]
    groups += sorted({(u, v) for u, v in lay.graph.edges}
                     | {(k, k + 1) for k in range(len(picks) - 1)})
    changed, sweep = True, 0
    while changed:
        changed, sweep = False, sweep + 1
        for group in groups:
            budget.check(f"in coordinate descent (sweep {sweep})")
            for combo in itertools.product(*(lay.options[k] for k in group)):
                if all(picks[k] == c for k, c in zip(group, combo)):
                    continue
                trial = list(picks)
                for k, c in zip(group, combo):
                    trial[k] = c
                t = lay.time(trial)
                if t < best * (1 - 1e-12):
                    best, picks, changed = t, trial, True
    return picks


def _mcmc(lay: _Layouts, picks: list[Candidate], steps: int, seed: int,
          beta: float, budget: Budget) -> list[Candidate]:
    """FlexFlow's MCMC (module docstring), the best seen."""
    rng = random.Random(seed)
    now = lay.time(picks)
    best, best_picks = now, list(picks)
    free = [k for k, opts in enumerate(lay.options) if len(opts) > 1]
    if not free:
        return picks
    for step in range(steps):
        budget.check(f"in MCMC (step {step} of {steps})")
        k = rng.choice(free)
        trial = list(picks)
        trial[k] = rng.choice([c for c in lay.options[k] if c != picks[k]])
        t = lay.time(trial)
        if t <= now or (math.isfinite(t) and now > 0 and
                        rng.random() < math.exp(-(t - now) / (beta * now))):
            picks, now = trial, t
            if t < best:
                best, best_picks = t, list(trial)
    return best_picks


def _baselines(graph: Graph, cluster: Cluster, microbatches: int, costs: MoveCosts,
               kw: dict[str, Any], orders: Orders) -> list[Choice]:
    """Alpa's choice (the chain DP with moves free) and Megatron's (where it has one),
    each priced on the graph: they bound the chain DP (whose own bound is the chain's
    objective, which skip connections raise) and are refined as well, so the answer is
    never slower than either."""
    schedule, budget = kw["schedule"], kw["time_limit"]
    free = search_chain(graph.layers, cluster, microbatches, moves="free", rerank=0, **kw)
    base = [evaluate_graph(graph, free.stages, cluster, microbatches, schedule, costs,
                           free.chunks)]
    try:
        mega = uniform(graph.layers, cluster, microbatches, schedule,
                       memory_limit=kw["memory_limit"], costs=costs, time_limit=budget,
                       edges=graph.edges, chunks=kw["chunks"], orders=orders)
        base.append(evaluate_graph(graph, mega.stages, cluster, microbatches, schedule, costs,
                                   mega.chunks))
    except SearchError as e:
        if "time_limit" in str(e):
            raise
    return base


def search_graph(graph: Graph, cluster: Cluster, microbatches: int, *,
                 schedule: str = "1f1b", memory_limit: int | None = None,
                 method: str = "descent", few: int = 4, steps: int = 2000, seed: int = 0,
                 beta: float = 0.05, cache: CostCache | None = None,
                 block: int | None = None, time_limit: float | Budget | None = None,
                 rerank: bool = True, chunks: int | None = None) -> Choice:
    """Stages, submeshes and candidates of ``graph``'s layers (module docstring).

    Args:
        graph: the model.
        cluster, microbatches, schedule, memory_limit, cache, block, time_limit, chunks:
            as :func:`reshard.search.search_chain` takes them (the time limit covers
            the whole search).
        method: ``"descent"`` or ``"mcmc"``.
        few: how many of the chain DP's best stage choices to refine.
        steps: MCMC's proposals per stage choice.
        seed: MCMC's random seed.
        beta: MCMC's temperature, relative to the current objective.
        rerank: the pipeline simulator picks the answer among the refined choices and
            the baselines' (Alpa's and Megatron's, priced on the graph), so it never
            simulates slower than either; False: the least objective.

    Raises:
        SearchError: as :func:`reshard.search.search_chain`, or an unknown method, or
            ``few``, ``steps``, ``seed``, ``beta`` out of range.
    """
    how = parse(Method, method, "method")
    if not isinstance(graph, Graph):
        raise SearchError(f"graph must be a reshard.search.Graph, got {type(graph).__name__}")
    n_few, n_steps = integer(few, "few", 1), integer(steps, "steps", 0)
    the_seed, temp = integer(seed, "seed"), real(beta, "beta", positive=True)
    budget = Budget.of(time_limit)
    limit = math.inf if memory_limit is None else memory_limit
    check_layers(graph.layers, cluster, microbatches, limit, graph.edges)
    costs = MoveCosts(cluster, cache=CostCache() if cache is None else cache)
    kw: dict[str, Any] = {"schedule": schedule, "memory_limit": memory_limit,
                          "cache": costs.cache, "block": block, "time_limit": budget,
                          "edges": graph.edges, "chunks": chunks}
    orders = Orders(budget=budget)
    base = _baselines(graph, cluster, microbatches, costs, kw, orders)
    bound = min(c.time for c in base)
    seeds = best_few(graph.layers, cluster, microbatches, n_few, bound=bound, **kw)
    refined: list[Choice] = []
    for got in [*seeds, *base]:
        lay = _Layouts(graph, got.stages, microbatches, got.schedule, costs, limit, got.chunks,
                       orders)
        picks = named_candidates(graph.layers, got.stages)
        picks = _descent(lay, picks, budget) if how == Method.DESCENT else _mcmc(
            lay, picks, n_steps, the_seed, temp, budget)
        refined.append(lay.choice(picks))
    if not rerank:
        return min(refined, key=lambda c: c.time)
    return rerank_choices(graph.layers, [*sorted(refined, key=lambda c: c.time), *base],
                          cluster, costs, graph.edges, time_limit=budget, orders=orders)[0]


def brute_layouts(graph: Graph, stages: Sequence[Stage], cluster: Cluster,
                  microbatches: int, schedule: str = "1f1b",
                  memory_limit: int | None = None, costs: MoveCosts | None = None,
                  chunks: int = 1) -> Choice | None:
    """The least objective over every candidate of every layer at ``stages`` (None:
    none within the memory limit): what the descent is measured against, on small
    graphs."""
    costs = MoveCosts(cluster) if costs is None else costs
    lay = _Layouts(graph, stages, microbatches, schedule, costs,
                   math.inf if memory_limit is None else memory_limit, chunks)
    best, best_picks = math.inf, None
    for picks in itertools.product(*lay.options):
        t = lay.time(picks)
        if t < best:
            best, best_picks = t, picks
    return None if best_picks is None else lay.choice(best_picks)


__all__ = ["METHODS", "Graph", "brute_layouts", "evaluate_graph", "search_graph"]

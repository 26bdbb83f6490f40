"""The stage DP of a graph with skip connections: stages chosen knowing the edges that
cross them (:mod:`reshard.search.stagedp`'s DP with a wider state).

A stage is a run of consecutive layers of the graph's topological order, as for a
chain, but a stage's move in is every edge that enters it from an earlier stage (a
skip may cross several), each priced from its producer's submesh and output layout to
the stage's submesh and the consumer's input layout. So the DP's state at a cut
carries what the edges still open there need: per *open producer* (a layer before the
cut with a consumer after it) its submesh and output layout. For a chain that is the
stage before's submesh and exit layout, the chain DP's own state.

A stage option (:class:`GraphOption`) says what it needs and gives: the input layout of
each of its layers fed from before it (``takes``) and the output layout of each of its
layers feeding a layer after it (``gives``); inside it, every edge between its own
layers is an inner move priced on its submesh. Its candidates are chosen by a DP over
its layers whose fronts (Pareto fronts of time, memory, activations, as
:func:`reshard.search.options.paths` keeps them) are keyed by those takes and the
outputs still open inside the stage, so the answer is exact for the graph's objective
(:mod:`reshard.search.objective`) as the chain DP is for a chain's.

The state grows with the number of open producers: a graph whose cuts leave more than
:data:`MAX_OPEN` open (a U-Transformer's middle), whose stage fronts pass
:data:`MAX_STATES`, or whose walk of open states (counted before any move is priced)
passes :data:`MAX_PAIRS` (state, option) pairs, is refused with :class:`TooWide`, and
the caller searches it as before (the chain DP over consecutive edges, then layouts on
the graph).

Alpa's layer construction, by contrast, charges a segment of operators the bytes of
every value it takes from before it (skips included) but prices no layouts; its stage
DP then prices no moves at all.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from reshard.search.costs import MoveCosts
from reshard.search.model import Budget, Layer, Placement
from reshard.search.objective import period
from reshard.search.options import Entry, Option, pareto, staircase
from reshard.search.stagedp import Holding, Key, _Graph, _live, shifted

MAX_OPEN = 3
"""The most open producers a cut may leave for the skip-aware DP (module docstring)."""

MAX_STATES = 20_000
"""The most open states (or stage fronts) the skip-aware DP builds before it gives up."""

MAX_PAIRS = 20_000
"""The most (open state, stage option) pairs the skip-aware DP may price (each pair may
ask reshard a cold estimate of its moves in); more, and the graph is searched as one too
wide (:class:`TooWide`), decided before any move is priced."""

Open = tuple[tuple[int, Placement, str], ...]
"""A cut's open producers: (layer, its stage's submesh, its output layout), by layer."""


class TooWide(Exception):
    """The graph is too wide at some cut for the skip-aware DP (module docstring)."""


@dataclass(frozen=True)
class GraphOption(Option):
    """A stage option of a graph (module docstring): ``takes`` is ``(layer, input
    layout)`` per layer of the stage fed from an earlier stage, ``gives`` ``(layer,
    output layout)`` per layer of it feeding a later stage."""

    takes: tuple[tuple[int, str], ...] = ()
    gives: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class Edges:
    """A graph's edges as the DP reads them: per layer its producers, and the last
    layer that takes its output (-1: none)."""

    into: tuple[tuple[int, ...], ...]
    reach: tuple[int, ...]

    @classmethod
    def of(cls, n: int, edges: Sequence[tuple[int, int]]) -> Edges:
        into: list[list[int]] = [[] for _ in range(n)]
        reach = [-1] * n
        for u, v in edges:
            into[v].append(u)
            reach[u] = max(reach[u], v)
        return cls(tuple(tuple(sorted(p)) for p in into), tuple(reach))

    def width(self) -> int:
        """The most producers open at any cut."""
        n = len(self.reach)
        return max((sum(1 for u in range(c) if self.reach[u] >= c) for c in range(1, n)),
                   default=0)

    def skips(self) -> bool:
        """Whether some edge joins layers that are not consecutive."""
        return any(r > u + 1 for u, r in enumerate(self.reach)) or any(
            any(u != v - 1 for u in p) for v, p in enumerate(self.into))


FrontKey = tuple[tuple[tuple[int, str], ...], tuple[tuple[int, str], ...]]
"""A stage front's key: its takes so far, and its layers' outputs still open."""


def _first_fronts(layer: Layer, k: int, p: Placement, g: Edges, limit: float,
                  cap: float) -> dict[FrontKey, list[Entry]]:
    """The fronts of a stage's first layer ``k`` on ``p``."""
    fronts: dict[FrontKey, list[Entry]] = {}
    for c in layer.candidates.get(p.shape, ()):
        if c.memory + c.activations <= limit and c.compute <= cap:
            takes = ((k, c.input),) if g.into[k] else ()
            live = ((k, c.output),) if g.reach[k] > k else ()
            fronts.setdefault((takes, live), []).append(
                (c.compute, c.memory, c.activations, c.compute, (c.name, None)))
    return fronts


def stage_paths(layers: Sequence[Layer], p: Placement, first: int, g: Edges,
                costs: MoveCosts, limit: float, budget: Budget, cap: float = math.inf,
                stop: int | None = None
                ) -> Iterator[tuple[int, dict[FrontKey, list[Entry]]]]:
    """Per last layer (up to ``stop``, default the end), the fronts of the stages from
    layer ``first`` to it on ``p`` (module docstring), none past ``limit`` bytes per
    device or ``cap`` seconds."""
    keep_memory = math.isfinite(limit)
    fronts = {k: pareto(v, keep_memory)
              for k, v in _first_fronts(layers[first], first, p, g, limit, cap).items()}
    end = len(layers) - 1 if stop is None else stop
    for last in range(first, end + 1):
        if not fronts:
            return
        yield last, fronts
        w = last + 1
        if w > end:
            return
        grown: dict[FrontKey, list[Entry]] = {}
        outside = any(u < first for u in g.into[w])
        for c in layers[w].candidates.get(p.shape, ()):
            budget.check("building the stages of layers {}.. on {} with skips (at layer {})",
                         first, p.shape, w)
            for (takes, live), front in fronts.items():
                step = c.compute
                for u, spec in live:
                    if u in g.into[w]:
                        step += costs.move(layers[u].output_shape, layers[u].dtype, p, spec,
                                           p, c.input)
                key = ((*takes, (w, c.input)) if outside else takes,
                       tuple((u, s) for u, s in live if g.reach[u] > w)
                       + (((w, c.output),) if g.reach[w] > w else ()))
                got = [(t + step, mem + c.memory, act + c.activations, comp + c.compute,
                        (c.name, trail))
                       for t, mem, act, comp, trail in front
                       if mem + c.memory + act + c.activations <= limit and t + step <= cap]
                if got:
                    grown.setdefault(key, []).extend(got)
        if len(grown) > MAX_STATES:
            raise TooWide(f"{len(grown)} stage fronts")
        fronts = {k: pareto(v, keep_memory) for k, v in grown.items()}


def graph_options(layers: Sequence[Layer], p: Placement, first: int, g: Edges,
                  costs: MoveCosts, limit: float, budget: Budget, cap: float = math.inf,
                  enough: float = math.inf, stop: int | None = None) -> list[GraphOption]:
    """Every stage option from layer ``first`` on ``p`` (as
    :func:`reshard.search.options.stage_options`, with takes and gives)."""
    out = []
    for last, fronts in stage_paths(layers, p, first, g, costs, limit, budget, cap, stop):
        for (takes, live), front in fronts.items():
            for t, mem, act, comp, trail in staircase(front, limit, enough):
                out.append(GraphOption(first, last, p, "", "", t, comp, trail, mem, act,
                                       takes=takes, gives=live))
    return out


def placed(options: Sequence[GraphOption], p: Placement) -> list[GraphOption]:
    """Options built on a submesh of ``p``'s class, placed on ``p``
    (:func:`reshard.search.options.place_class`)."""
    return [o if o.placement == p else dataclasses.replace(o, placement=p) for o in options]


@dataclass
class _Walk:
    """The open states met so far: each tuple's id (the empty one is -1, the start's)."""

    ids: dict[Open, int]
    states: list[Open]

    def id(self, state: Open) -> int:
        if not state:
            return -1
        got = self.ids.get(state)
        if got is None:
            got = self.ids[state] = len(self.states)
            self.states.append(state)
            if len(self.states) > MAX_STATES:
                raise TooWide(f"{len(self.states)} open states")
        return got

    def of(self, e: int) -> Open:
        return () if e < 0 else self.states[e]


def _move_in(o: GraphOption, state: Open, layers: Sequence[Layer], g: Edges,
             costs: MoveCosts, per_host: int) -> float:
    """The option's move in: every edge into it from an open producer of ``state``."""
    held = {u: (pl, spec) for u, pl, spec in state}
    m = 0.0
    for v, spec_in in o.takes:
        for u in g.into[v]:
            if u < o.first:
                pl, spec_out = held[u]
                m += shifted(costs, per_host, layers[u], pl, spec_out, o.placement, spec_in)
    return m


def _after(o: GraphOption, state: Open, g: Edges) -> Open:
    """The open producers after ``o`` is taken from ``state``."""
    return tuple((u, pl, s) for u, pl, s in state if g.reach[u] > o.last) + tuple(
        (u, o.placement, s) for u, s in o.gives)


def _size_up(live: Sequence[Option], at: dict[tuple[int, int], list[int]], g: Edges,
             budget: Budget) -> int:
    """The (state, option) pairs the DP would price with no bound, counted by walking
    the open states without pricing a move; :class:`TooWide` as soon as they pass
    :data:`MAX_PAIRS` (each may ask a cold estimate: the chain DP then answers, at
    the cost of this walk alone)."""
    walk = _Walk({}, [])
    seen: dict[tuple[int, int], set[int]] = {(0, 0): {-1}}
    todo = [(0, 0)]
    pairs = 0
    while todo:
        i, d = heapq.heappop(todo)
        states, ks = seen.pop((i, d)), at.get((i, d), ())
        pairs += len(states) * len(ks)
        if pairs > MAX_PAIRS:
            raise TooWide(f"over {MAX_PAIRS} stage options from open states")
        budget.check("counting the stages with skips (at layer {}, device {})", i, d)
        for e in states:
            state = walk.of(e)
            for k in ks:
                o = live[k]
                assert isinstance(o, GraphOption)
                nxt = (o.last + 1, d + o.placement.size)
                if nxt not in seen:
                    seen[nxt] = set()
                    heapq.heappush(todo, nxt)
                seen[nxt].add(walk.id(_after(o, state, g)))
    return pairs


def build_graph(options: Sequence[GraphOption], layers: Sequence[Layer], g: Edges,
                devices: int, per_host: int, schedule: str, microbatches: int,
                costs: MoveCosts, bound: float, budget: Budget,
                holding: Holding | None = None) -> _Graph:
    """The DP's transitions (as :func:`reshard.search.stagedp.build`'s) whose period
    over ``B - 1`` microbatches is within ``bound``, states carrying the open
    producers, walked forward from the start (only states some path reaches)."""
    holding = Holding() if holding is None else holding
    live, at = _live(options, devices, len(layers))
    _size_up(live, at, g, budget)
    smallest = min((o.placement.size for o in live), default=1)
    steps = [holding.steps(o, o.start, min(len(layers) - o.first, (devices - o.start) // smallest))
             for o in live]
    walk = _Walk({}, [])
    seen: dict[tuple[int, int], set[int]] = {(0, 0): {-1}}
    todo = [(0, 0)]
    trans: list[tuple[float, float, Key, Key, int, float]] = []
    b1 = microbatches - 1
    while todo:
        i, d = heapq.heappop(todo)
        budget.check("pricing the moves into stages with skips (at layer {}, device {}, "
                     "{} states, {} estimates asked)", i, d, len(walk.states), costs.asked)
        for e in sorted(seen.pop((i, d))):
            state = walk.of(e)
            for k in at.get((i, d), ()):
                o = live[k]
                assert isinstance(o, GraphOption)
                budget.check("pricing the moves into stages with skips (at layer {}, device "
                             "{}, {} states, {} estimates asked)", i, d, len(walk.states),
                             costs.asked)
                m = _move_in(o, state, layers, g, costs, per_host)
                p = period(schedule, o.inner, m)
                if b1 * p > bound:
                    continue
                nxt = (o.last + 1, d + o.placement.size)
                after = walk.id(_after(o, state, g))
                if nxt not in seen:
                    seen[nxt] = set()
                    heapq.heappush(todo, nxt)
                seen[nxt].add(after)
                trans.extend((p, o.inner + m, (i, d, e, before), (*nxt, after, left), k, m)
                             for before, left in steps[k])
    trans.sort(key=lambda t: t[0])
    return _Graph(list(live), trans, holding.starts(), holding.chunks)


__all__ = ["MAX_OPEN", "MAX_PAIRS", "MAX_STATES", "Edges", "GraphOption", "Open", "TooWide",
           "build_graph", "graph_options", "placed", "stage_paths"]

"""Stages, submeshes and layouts of a chain of layers, with every move priced.

The objective is :mod:`reshard.search.objective`'s. The search is exact for it: as
Alpa's stage DP it bounds the slowest stage's period ``t`` (every distinct period), finds
the least ``sum_s`` over stages whose periods are all within ``t`` by dynamic
programming over (next layer, next device, the stage before's submesh and output
layout) (:mod:`reshard.search.stagedp`, every bound in one incremental pass), and keeps
the best ``sum + (B - 1) * t``. Inside a stage the layers' candidates are chosen by a
chain DP over (layer, candidate) whose entries are the Pareto front of (time, memory),
so a memory limit per device is met exactly (:mod:`reshard.search.options`).

The baselines bound it: Alpa's choice (the same search with every move free, then
priced) and Megatron's (:func:`reshard.search.baselines.uniform`); a stage that alone
takes longer than the better of them over ``B - 1`` microbatches is in no better
choice, and is never built or priced. By default the pipeline simulator then re-ranks
the DP's best few together with both baselines (:func:`reshard.search.rerank`), so the
answer never simulates slower than either.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from reshard.cluster import Cluster
from reshard.errors import SearchError
from reshard.planner.estimates import CostCache
from reshard.search.baselines import uniform
from reshard.search.blocks import blocks, expand
from reshard.search.checks import integer, optional_limit, spec_rank
from reshard.search.costs import MoveCosts
from reshard.search.kinds import MOVES, Moves, SearchSchedule, parse
from reshard.search.memory import Orders, chain_in_flight
from reshard.search.model import (
    Budget,
    Choice,
    Layer,
    Shape,
    check_cluster,
    devices,
    placements,
)
from reshard.search.objective import (
    SCHEDULES,
    chain_edges,
    evaluate,
    named_candidates,
    objective,
    period,
    price,
    stage_index,
)
from reshard.search.options import Links, Option, most_in_flight, place_class, stage_options
from reshard.search.reach import block_shapes, reach
from reshard.search.simulated import rerank as rerank_choices
from reshard.search.skips import MAX_OPEN, Edges, TooWide, build_graph, graph_options, placed
from reshard.search.stagedp import Holding, Path, _Graph, best_paths, build, path_stages
from reshard.search.virtual import holding, place_pieces, virtual_shapes

MAX_BLOCKS = 48
"""A chain of more layers than this is searched in blocks of ``ceil(L / MAX_BLOCKS)``
consecutive layers (:func:`reshard.search.blocks.blocks`), unless the caller sets
``block``."""

RERANK = 4
"""How many of the DP's best choices the simulator re-ranks by default (with the
baselines')."""


def check_layers(layers: object, cluster: object, microbatches: object,
                 limit: float, edges: Sequence[tuple[int, int]] | None = None) -> int:
    """Everything a search takes checked before it runs (a SearchError naming the layer,
    the candidate or the value); ``microbatches`` as an ``int``."""
    if not isinstance(layers, Sequence) or isinstance(layers, str) or not layers:
        raise SearchError(f"the model has no layers: give a non-empty sequence of Layer, "
                          f"got {layers!r:.80}")
    for k, layer in enumerate(layers):
        if not isinstance(layer, Layer):
            raise SearchError(f"layer {k} must be a reshard.search.Layer, got {layer!r:.80}")
    b = integer(microbatches, "microbatches", 1)
    if not isinstance(cluster, Cluster):
        raise SearchError(f"cluster must be a reshard.Cluster, got {type(cluster).__name__}")
    check_cluster(cluster)
    for u, v in chain_edges(len(layers)) if edges is None else edges:
        rank = len(layers[u].output_shape)
        for shape, cands in layers[v].candidates.items():
            for c in cands:
                if spec_rank(c.input, "") != rank:
                    raise SearchError(
                        f"layer {v} ({layers[v].name!r}) candidate {c.name!r} on {shape} "
                        f"takes its input as {c.input!r} (rank {spec_rank(c.input, '')}), "
                        f"but layer {u} ({layers[u].name!r}) gives shape "
                        f"{layers[u].output_shape} (rank {rank})")
    fitting: dict[Shape, bool] = {}
    for k, layer in enumerate(layers):
        _check_layer(k, layer, len(layers), cluster, limit, fitting)
    return b


def _check_layer(k: int, layer: Layer, n: int, cluster: Cluster, limit: float,
                 fitting: dict[Shape, bool]) -> None:
    """A layer with no candidate, no output shape, no submesh shape that fits the
    cluster (``fitting``: known so far, by shape), or nothing within the memory limit is
    refused, named."""
    what = f"layer {k} ({layer.name!r})"
    if not any(layer.candidates.values()):
        raise SearchError(f"{what} has no candidate on any submesh shape; give at least one")
    if k + 1 < n and not layer.output_shape:
        raise SearchError(f"{what} gives no output shape")
    for s in layer.candidates:
        if s not in fitting:
            fitting[s] = any(placements(cluster, s, d) is not None
                             for d in range(0, devices(cluster), s[1]))
    fits = [s for s, cands in layer.candidates.items() if cands and fitting[s]]
    if not fits:
        g = len(cluster.hosts[0])
        raise SearchError(
            f"{what} has candidates only on submesh shapes {sorted(layer.candidates)}, none "
            f"of which fits the cluster of {cluster.num_hosts} hosts of {g} devices: give "
            f"it candidates on (1, g) with g <= {g} or (h, {g}) with h <= {cluster.num_hosts}")
    lightest = min((c.memory, s) for s in fits for c in layer.candidates[s])
    if lightest[0] > limit:
        raise SearchError(
            f"{what}: every candidate holds more than the memory limit of {limit:.0f} bytes "
            f"per device (the lightest {lightest[0]} bytes, on {lightest[1]}); give a larger "
            f"memory_limit or lighter candidates")


def search_chain(layers: Sequence[Layer], cluster: Cluster, microbatches: int, *,
                 schedule: str = "1f1b", memory_limit: int | None = None,
                 moves: str = "priced", cache: CostCache | None = None,
                 block: int | None = None, time_limit: float | Budget | None = None,
                 rerank: int = RERANK,
                 edges: Sequence[tuple[int, int]] | None = None,
                 chunks: int | None = None) -> Choice:
    """The stages, submeshes and candidates of ``layers`` (module docstring) on
    ``cluster`` with ``microbatches`` microbatches.

    Args:
        layers: the chain, first layer first.
        cluster: a regular cluster (hosts of one size, devices numbered host by host).
        microbatches: B.
        schedule: a :class:`~reshard.search.kinds.SearchSchedule` or its name
            (``"interleaved-1f1b"``, ``"zb-v"``, ``"dualpipe-v"``: virtual stages,
            :mod:`reshard.search.virtual`).
        memory_limit: the most bytes a device may hold (its stage's candidates'
            ``memory``, and their ``activations`` times the stage's in-flight count
            under the schedule: :mod:`reshard.search.memory`); None: no limit.
        moves: ``"priced"`` (reshard's estimates) or ``"free"`` (moves cost 0 while
            choosing, Alpa's way; the answer reports the cost the choice really has).
        cache: reshard's estimates, kept across searches.
        block: search in blocks of this many layers (:mod:`reshard.search.blocks`);
            default 1 up to :data:`MAX_BLOCKS` layers, else ``ceil(L / MAX_BLOCKS)``.
            The DP is exact over stage boundaries between blocks, and a choice's time is
            the objective of its stages on the layers themselves.
        time_limit: the most seconds the search may take, every phase included.
        rerank: how many of the DP's best choices the pipeline simulator re-ranks with
            the baselines' (the answer's ``simulated`` is set, and it never simulates
            slower than Alpa's or Megatron's choice); 0: the objective's best, exact,
            unsimulated (also with ``moves="free"``: Alpa's choice is that DP's own).
        edges: a graph's edges (default: a chain). With skips the DP prices every edge
            where it chooses stages (:mod:`reshard.search.skips`; a graph too wide for
            that prices the moves between consecutive layers joined by one).
        chunks: pieces per submesh under interleaved 1F1B (default 2).

    Raises:
        SearchError: bad input (naming the layer, candidate or value), no stages that
            use every device within the memory limit, or the time limit spent (naming
            the phase it was spent in).
    """
    ask = _Ask.of(layers, cluster, microbatches, schedule, memory_limit, moves, cache, block,
                  time_limit, edges, chunks)
    keep = integer(rerank, "rerank", 0)
    base = _baselines(ask) if ask.how == "priced" else []
    bound = min((c.time for c in base), default=math.inf)
    if ask.how == "free":  # Megatron's choice bounds the moves-free DP (_baselines)
        mega = _megatron(ask)
        found = _best(ask, 1, mega[0].time if mega else None) or _best(ask, 1, None)
    else:
        found = _best(ask, max(1, keep), bound)
    found = found or sorted(base, key=lambda c: c.time)[:1] or _no_answer(ask)
    if keep == 0 or ask.how == "free":  # Alpa's choice is the moves-free DP's own
        return found[0]
    ranked = rerank_choices(layers, [*found, *base], cluster, ask.costs, ask.edges,
                            time_limit=ask.budget, orders=ask.orders)
    return ranked[0]


def best_few(layers: Sequence[Layer], cluster: Cluster, microbatches: int, count: int, *,
             schedule: str = "1f1b", memory_limit: int | None = None,
             moves: str = "priced", cache: CostCache | None = None,
             block: int | None = None, bound: float | None = None,
             time_limit: float | Budget | None = None,
             edges: Sequence[tuple[int, int]] | None = None,
             chunks: int | None = None) -> list[Choice]:
    """The DP's best answer first, then up to ``count - 1`` more: the least-sum stages
    under each other bound on the slowest stage's period that could still be among the
    best ``count`` (each the best choice whose slowest stage is that bound's), best
    objective first, among the choices no slower than the baselines (priced: Alpa's
    and Megatron's choices bound the search) or than ``bound`` seconds where given (a
    search whose objective is another, :func:`reshard.search.search_graph`'s, gives its
    own). Other arguments and errors as :func:`search_chain`'s."""
    ask = _Ask.of(layers, cluster, microbatches, schedule, memory_limit, moves, cache, block,
                  time_limit, edges, chunks)
    n = integer(count, "count", 1)
    base: list[Choice] = []
    if bound is None and ask.how == "priced":
        base = _baselines(ask)
        bound = min((c.time for c in base), default=math.inf)
    found = _best(ask, n, bound)
    return found or sorted(base, key=lambda c: c.time)[:n]


@dataclass(frozen=True)
class _Ask:
    """A search's checked arguments and its costs."""

    layers: Sequence[Layer]
    cluster: Cluster
    microbatches: int
    sched: SearchSchedule
    how: Moves
    limit: float
    memory_limit: int | None
    costs: MoveCosts
    size: int
    budget: Budget
    links: Links = None
    chunks: int = 1
    orders: Orders = field(default_factory=Orders, compare=False)
    skips: Edges | None = None
    full: tuple[tuple[int, int], ...] = ()
    whole: bool = False

    @property
    def edges(self) -> list[tuple[int, int]] | None:
        """The edges a choice is priced on: every edge of the graph where the search
        knows the skips (:mod:`reshard.search.skips`; ``whole``), else consecutive
        layers joined (None: all)."""
        if self.whole:
            return list(self.full)
        return None if self.links is None else [(k, k + 1) for k in sorted(self.links)]

    @classmethod
    def of(cls, layers: Sequence[Layer], cluster: Cluster, microbatches: object,
           schedule: str, memory_limit: object, moves: str, cache: CostCache | None,
           block: object, time_limit: object,
           edges: Sequence[tuple[int, int]] | None = None, chunks: object = None) -> _Ask:
        """The arguments checked (:func:`check_layers`)."""
        budget = Budget.of(time_limit)
        sched = parse(SearchSchedule, schedule, "schedule")
        how = parse(Moves, moves, "moves")
        v = sched.chunks(None if chunks is None else integer(chunks, "chunks (per submesh)", 1))
        mem = optional_limit(memory_limit, "memory_limit (bytes per device)")
        limit = math.inf if mem is None else mem
        b = check_layers(layers, cluster, microbatches, limit, edges)
        size = max(1, -(-len(layers) // MAX_BLOCKS)) if block is None else integer(
            block, "block (layers per block)", 1)
        if cache is not None and not isinstance(cache, CostCache):
            raise SearchError(f"cache must be a CostCache or None, got {type(cache).__name__}")
        costs = MoveCosts(cluster, how == "free", CostCache() if cache is None else cache)
        links = None if edges is None else frozenset(u for u, v in edges if v == u + 1)
        full = () if edges is None else tuple(sorted({(int(u), int(v)) for u, v in edges}))
        graph = Edges.of(len(layers), full) if edges is not None else None
        skips = graph if (graph is not None and how == Moves.PRICED and size == 1
                          and graph.skips() and graph.width() <= MAX_OPEN) else None
        return cls(tuple(layers), cluster, b, sched, how, limit, mem, costs, size, budget,
                   links, v, Orders(budget=budget), skips, full, skips is not None)

    def free(self) -> _Ask:
        """The same search with moves free (then blind to the skips: every move is 0)."""
        return dataclasses.replace(self, how=Moves.FREE, skips=None,
                                   costs=MoveCosts(self.cluster, True, self.costs.cache))

    def priced(self) -> MoveCosts:
        """Costs that price every move."""
        return self.costs if not self.costs.free else MoveCosts(self.cluster, False,
                                                                self.costs.cache)


def _megatron(ask: _Ask) -> list[Choice]:
    """Megatron's choice, priced by the objective (none where there is none)."""
    try:
        return [uniform(ask.layers, ask.cluster, ask.microbatches, ask.sched,
                        memory_limit=ask.memory_limit, costs=ask.priced(),
                        time_limit=ask.budget, edges=ask.edges, chunks=ask.chunks,
                        orders=ask.orders)]
    except SearchError as e:
        if "time_limit" in str(e):
            raise
        return []


def _baselines(ask: _Ask) -> list[Choice]:
    """Megatron's choice (where there is one) and Alpa's (moves free, then priced), each
    priced by the objective. Megatron's bounds Alpa's DP: its priced time is no less
    than its time with moves free."""
    out = _megatron(ask)
    out.extend(_best(ask.free(), 1, out[0].time if out else None))
    return out


def _best(ask: _Ask, count: int, bound: float | None) -> list[Choice]:
    """The DP's best ``count`` choices (module docstring), best objective first, none
    above ``bound``."""
    layers = ask.layers
    if ask.size > 1:
        only = None
        if not ask.sched.virtual and bound is not None and ask.microbatches > 1:
            only = block_shapes(layers, ask.size, ask.cluster, ask.limit,
                                bound / (ask.microbatches - 1), ask.budget)
            if not only:
                return []  # no stage of any shape on a path within the bound
        merged, firsts, runs, joined = blocks(layers, ask.size, ask.costs,
                                              ask.limit / ask.chunks, ask.budget, ask.links,
                                              only)
        got = _best(dataclasses.replace(ask, layers=tuple(merged), size=1, links=joined),
                    count, bound)
        out = [evaluate(layers, expand(c.stages, runs, firsts, len(layers)), ask.cluster,
                        ask.microbatches, ask.sched, ask.priced(), ask.edges, ask.chunks)
               for c in got]
        return sorted(out, key=lambda c: c.time)
    top = math.inf if bound is None else bound
    b1 = ask.microbatches - 1
    cap = top / b1 if b1 and math.isfinite(top) else math.inf
    try:
        found = (_virtual_paths if ask.sched.virtual else _chain_paths)(ask, count, top, cap)
    except TooWide:  # the skips' state outgrew the DP: the chain's, skips priced after
        return _best(dataclasses.replace(ask, skips=None), count, bound)
    if not found and bound is None:
        _no_answer(ask)
    out = []
    blind = ask.how == Moves.FREE or (ask.whole and ask.skips is None)
    for path in found:
        stages = path_stages(path)
        out.append(evaluate(layers, stages, ask.cluster, ask.microbatches, ask.sched,
                            ask.priced(), ask.edges, ask.chunks) if blind
                   else objective(stages, ask.microbatches, ask.sched, ask.chunks))
    return sorted(out, key=lambda c: c.time)[:count]


def _chain_paths(ask: _Ask, count: int, top: float, cap: float) -> list[Path]:
    """The one-chunk DP's best ``count`` paths (a stage per submesh), none above
    ``top``, no stage's inner time above ``cap``."""
    layers, total = ask.layers, devices(ask.cluster)
    held = _most_held(ask)
    options = _options(layers, ask.cluster, ask.costs, ask.limit, ask.budget, cap,
                       ask.links, None, held, ask.skips, tiled=True)
    g = _build(ask, options, total, top, _chain_holding(ask, options, held))
    return best_paths(g, (len(layers), total), ask.microbatches, count, ask.budget)


def _build(ask: _Ask, options: Sequence[Option], total: int, top: float,
           hold: Holding) -> _Graph:
    """The stage DP's transitions: the chain's (:func:`reshard.search.stagedp.build`),
    or with the skips' open producers in the state where the search knows them
    (:func:`reshard.search.skips.build_graph`)."""
    per = len(ask.cluster.hosts[0])
    if ask.skips is not None:
        return build_graph(options, ask.layers, ask.skips, total, per,  # type: ignore[arg-type]
                           ask.sched, ask.microbatches, ask.costs, top, ask.budget, hold)
    return build(options, ask.layers, total, per, ask.sched, ask.microbatches, ask.costs,
                 top, ask.budget, ask.links, hold)


def _virtual_paths(ask: _Ask, count: int, top: float, cap: float) -> list[Path]:
    """The virtual-stage DP's best ``count`` paths over every submesh shape
    (:mod:`reshard.search.virtual`), as :func:`_chain_paths`."""
    layers, slots = ask.layers, ask.chunks * devices(ask.cluster)
    found: list[Path] = []
    for shape, places in virtual_shapes(layers, ask.cluster, ask.sched, ask.chunks,
                                        ask.microbatches):
        hold = holding(ask.sched, len(places), ask.chunks, ask.microbatches, ask.limit,
                       places[0].size, ask.orders)
        most = [max(hold.slots.values()) if hold.slots else 1] * len(layers)
        options = place_pieces(_options(layers, ask.cluster, ask.costs, hold.limit,
                                        ask.budget, cap, ask.links, [shape], most, ask.skips),
                               places, ask.sched, ask.chunks)
        g = _build(ask, options, slots, top, hold)
        found += best_paths(g, (len(layers), slots), ask.microbatches, count, ask.budget)
    return found


def _chain_holding(ask: _Ask, options: Sequence[Option], held: Sequence[int]) -> Holding:
    """Where a one-chunk stage option fits the memory limit: by the stages still to come
    (:class:`reshard.search.stagedp.Holding`), counted as far as some option's fit
    changes (none: no count); ``held``: :func:`_most_held`."""
    b = ask.microbatches
    need = max((n + 1 for n, o in ((most_in_flight(o.memory, o.activations, ask.limit), o)
                                   for o in options) if n < held[o.first]), default=0)
    if need == 0:
        return Holding(ask.limit)
    top = 1
    while chain_in_flight(ask.sched, top + 1, b) < min(need, held[0]):
        top += 1
    return Holding(ask.limit, tuple(chain_in_flight(ask.sched, k, b) for k in range(1, top + 2)))


def _most_held(ask: _Ask) -> list[int]:
    """Per first layer, the most microbatches a one-chunk stage starting there can hold
    (the most stages from there on: each a layer on a submesh of the smallest shape)."""
    smallest = min((s[0] * s[1] for layer in ask.layers for s in layer.candidates), default=1)
    n, total = len(ask.layers), devices(ask.cluster)
    return [chain_in_flight(ask.sched, min(n - i, total // smallest), ask.microbatches)
            for i in range(n)]


def _no_answer(ask: _Ask) -> NoReturn:
    shapes = sorted({s for layer in ask.layers for s in layer.candidates
                     if placements(ask.cluster, s, 0) is not None})
    how = "" if not ask.sched.virtual else (
        f" as {ask.chunks} pieces of at least one layer on each of its submeshes of one "
        f"shape ({ask.sched.value})")
    raise SearchError(
        f"no stages use all {devices(ask.cluster)} devices: the layers' submesh "
        f"shapes that fit the cluster {shapes} cannot tile it with every layer in a stage"
        + how
        + ("" if ask.memory_limit is None else
           f" within the memory limit of {ask.memory_limit} bytes per device")
        + "; give more layers, candidates on other shapes"
        + ("" if ask.memory_limit is None else " or a larger memory_limit"))


def _options(layers: Sequence[Layer], cluster: Cluster, costs: MoveCosts, limit: float,
             budget: Budget, cap: float, links: Links = None,
             only: Sequence[Shape] | None = None,
             enough: Sequence[int] | None = None, skips: Edges | None = None,
             tiled: bool = False) -> list[Option]:
    """Every stage option (on the shapes ``only`` where given; ``enough``: per first
    layer the most microbatches a stage there can hold; ``skips``: a graph's edges, the
    options knowing them, :mod:`reshard.search.skips`), none whose inner time passes
    ``cap``: built once per submesh shape and place on a host
    (:mod:`reshard.search.options`), placed on every submesh of that class; ``tiled``
    (one stage per submesh): only those that can lie on a path of the DP
    (:mod:`reshard.search.reach`)."""
    per = len(cluster.hosts[0])
    shapes: list[Shape] = sorted({s for layer in layers for s in layer.candidates}
                                 if only is None else only)
    paths_ok = reach(layers, cluster, shapes, limit, cap, budget) if tiled else None
    out: list[Option] = []
    for shape in shapes:
        classes: dict[int, list[int]] = {}
        for d in range(devices(cluster)):
            if placements(cluster, shape, d) is not None:
                classes.setdefault(d % per, []).append(d)
        for offset, firsts in classes.items():
            home = placements(cluster, shape, offset)
            assert home is not None  # a submesh of the class on the first host fits
            for i in range(len(layers)):
                lasts = {d: set(paths_ok.lasts(shape, i, d)) for d in firsts} \
                    if paths_ok is not None else None
                stop = None if lasts is None else max((max(v) for v in lasts.values() if v),
                                                      default=-1)
                if stop is not None and stop < i:
                    continue
                most = math.inf if enough is None else enough[i]
                built: Sequence[Option] = (
                    stage_options(layers, home, i, costs, limit, budget, cap, links, most, stop)
                    if skips is None else
                    graph_options(layers, home, i, skips, costs, limit, budget, cap, most, stop))
                for d in firsts:
                    p = placements(cluster, shape, d)
                    assert p is not None
                    mine = built if lasts is None else [o for o in built if o.last in lasts[d]]
                    out.extend(place_class(mine, p) if skips is None
                               else placed(mine, p))  # type: ignore[arg-type]
    return out


__all__ = ["MAX_BLOCKS", "MOVES", "RERANK", "SCHEDULES", "best_few", "chain_edges",
           "check_layers", "evaluate", "named_candidates", "objective", "period", "price",
           "search_chain", "stage_index"]

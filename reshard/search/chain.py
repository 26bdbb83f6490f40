"""Stages, submeshes and layouts of a chain of layers, with every move priced.

The objective (Alpa's, with the moves it leaves out): a stage ``s`` spends per
microbatch ``c_s`` (its layers' compute and the moves between its own layers) and
``m_s`` (its input activation moved from the stage before, and the gradient moved
back: reshard's estimates, :mod:`reshard.search.costs`). With ``B`` microbatches

* ``1f1b`` (the moves on the critical path): ``T = sum_s (c_s + m_s) + (B - 1) * max_s
  (c_s + m_s)``;
* ``eager-1f1b`` (a stage sends its next activation while it computes, so a move hides
  behind compute): ``T = sum_s (c_s + m_s) + (B - 1) * max_s max(c_s, m_s)``.

The search (:func:`search_chain`) is exact for that objective: as Alpa's stage DP it
fixes the slowest stage's bound ``t`` (each distinct stage period, in increasing
order), finds the least ``sum_s`` over stages whose periods are all within ``t`` by
dynamic programming over (next layer, next device, the stage before's submesh and
output layout), and keeps the best ``sum + (B - 1) * t``, stopping once ``(B - 1) * t``
alone is no better. Inside a stage the layers' candidates are chosen by a chain DP
over (layer, candidate) whose entries are the Pareto front of (time, memory), so a
memory limit per device is met exactly. ``moves="free"`` runs the same search with
every move at 0 (Alpa's, whose stage DP prices none); :func:`evaluate` then gives any
choice's real objective.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from reshard.cluster import Cluster
from reshard.errors import SearchError
from reshard.planner.estimates import CostCache
from reshard.search.costs import MoveCosts
from reshard.search.model import (
    Budget,
    Candidate,
    Choice,
    Layer,
    Placement,
    Shape,
    Stage,
    check_cluster,
    placements,
)

SCHEDULES = ("1f1b", "eager-1f1b")
"""The schedules the objective models (module docstring)."""

MOVES = ("priced", "free")
"""How moves are priced while choosing."""


@dataclass(frozen=True)
class _Option:
    """A stage the DP may take: layers ``first..last`` on ``placement``, entered in
    ``entry``'s input layout, left in ``exit``'s output layout, at ``inner`` seconds
    per microbatch (compute and inner moves) through candidates ``names``."""

    first: int
    last: int
    placement: Placement
    entry: Candidate
    exit: Candidate
    inner: float
    compute: float
    names: tuple[str, ...]


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


def _check(layers: Sequence[Layer], cluster: Cluster, microbatches: int) -> None:
    if not layers:
        raise SearchError("the model has no layers")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or \
            microbatches < 1:
        raise SearchError(f"microbatches must be an integer >= 1, got {microbatches!r}")
    check_cluster(cluster)
    for k, layer in enumerate(layers):
        if not any(layer.candidates.values()):
            raise SearchError(f"layer {k} ({layer.name!r}) has no candidate on any submesh "
                              f"shape; give at least one")
        if k + 1 < len(layers) and not layer.output_shape:
            raise SearchError(f"layer {k} ({layer.name!r}) gives no output shape")


def _stage_options(layers: Sequence[Layer], p: Placement, first: int, costs: MoveCosts,
                   limit: float) -> Iterator[_Option]:
    """Every (last layer, entry, exit) of a stage starting at layer ``first`` on ``p``,
    each at the least time of its candidates within ``limit`` bytes per device."""
    shape = p.shape
    # per candidate of the current layer: Pareto front of (time, memory, names) paths
    fronts: dict[tuple[Candidate, Candidate], list[tuple[float, int, float, tuple[str, ...]]]] = {}
    for c in layers[first].candidates.get(shape, ()):
        if c.memory <= limit:
            fronts[(c, c)] = [(c.compute, c.memory, c.compute, (c.name,))]
    for last in range(first, len(layers)):
        if not fronts:
            return
        for (entry, cur), front in fronts.items():
            t, _, comp, names = front[0]  # least time first
            yield _Option(first, last, p, entry, cur, t, comp, names)
        if last + 1 == len(layers):
            return
        prev_layer, layer = layers[last], layers[last + 1]
        grown: dict[tuple[Candidate, Candidate], list[tuple[float, int, float, tuple[str, ...]]]] = {}
        for c in layer.candidates.get(shape, ()):
            for (entry, cur), front in fronts.items():
                step = c.compute + costs.move(prev_layer.output_shape, prev_layer.dtype,
                                              p, cur.output, p, c.input)
                got = grown.setdefault((entry, c), [])
                for t, mem, comp, names in front:
                    if mem + c.memory <= limit:
                        got.append((t + step, mem + c.memory, comp + c.compute,
                                    (*names, c.name)))
        fronts = {k: _pareto(v) for k, v in grown.items() if v}


def _pareto(entries: list[tuple[float, int, float, tuple[str, ...]]]
            ) -> list[tuple[float, int, float, tuple[str, ...]]]:
    """The entries no other beats in both time and memory, least time first."""
    out: list[tuple[float, int, float, tuple[str, ...]]] = []
    for e in sorted(entries, key=lambda e: (e[0], e[1])):
        if not out or e[1] < out[-1][1]:
            out.append(e)
    return out


MAX_BLOCKS = 16
"""A chain of more layers than this is searched in blocks of ``ceil(L / MAX_BLOCKS)``
consecutive layers (:func:`blocks`), unless the caller sets ``block``."""


def blocks(layers: Sequence[Layer], size: int
           ) -> tuple[list[Layer], list[int], dict[tuple[int, Shape, str], tuple[str, ...]]]:
    """``layers`` in blocks of ``size`` consecutive layers (the last takes the rest), each
    block's first layer, and what each block candidate runs on its layers. A block
    candidate runs, on every layer of the block, a candidate whose input and output
    layout are one layout, the same for all (no move between them): per layout and
    submesh shape, the combinations no other beats in both compute and memory (a MoE
    block of a dense and an expert layer keeps dense dp with expert dp, and with expert
    parallel); its compute and memory are the layers' sums. Stage boundaries then fall
    between blocks (Alpa's layer clustering, with boundaries kept where the layers
    change)."""
    merged: list[Layer] = []
    firsts: list[int] = []
    runs: dict[tuple[int, Shape, str], tuple[str, ...]] = {}
    for a in range(0, len(layers), size):
        part = layers[a:a + size]
        cands: dict[Shape, tuple[Candidate, ...]] = {}
        for shape in part[0].candidates:
            got = []
            specs = sorted({c.input for c in part[0].candidates[shape] if c.input == c.output})
            for spec in specs:
                # (compute, memory, compute, names): the stage DP's Pareto entries
                front: list[tuple[float, int, float, tuple[str, ...]]] = [(0.0, 0, 0.0, ())]
                for layer in part:
                    fits = [c for c in layer.candidates.get(shape, ())
                            if c.input == c.output == spec]
                    front = _pareto([(t + c.compute, m + c.memory, t + c.compute,
                                      (*names, c.name)) for t, m, _, names in front
                                     for c in fits])
                for t, m, _, names in front:
                    name = names[0] if len(set(names)) == 1 else "+".join(names)
                    runs[(len(merged), shape, name)] = names
                    got.append(Candidate(name, t, spec, spec, m))
            if got:
                cands[shape] = tuple(got)
        merged.append(Layer(f"{part[0].name}..{part[-1].name}", part[-1].output_shape,
                            part[-1].dtype, cands))
        firsts.append(a)
    return merged, firsts, runs


def search_chain(layers: Sequence[Layer], cluster: Cluster, microbatches: int, *,
                 schedule: str = "1f1b", memory_limit: int | None = None,
                 moves: str = "priced", cache: CostCache | None = None,
                 block: int | None = None, time_limit: float | Budget | None = None
                 ) -> Choice:
    """The stages, submeshes and candidates of ``layers`` that minimise the objective
    (module docstring) on ``cluster`` with ``microbatches`` microbatches.

    Args:
        layers: the chain, first layer first.
        cluster: a regular cluster (hosts of one size, devices numbered host by host);
            every device is used, by one stage.
        microbatches: B.
        schedule: ``"1f1b"`` or ``"eager-1f1b"``.
        memory_limit: the most bytes a device may hold (the sum of its stage's
            candidates' ``memory``); None: no limit.
        moves: ``"priced"`` (reshard's estimates) or ``"free"`` (moves cost 0 while
            choosing; the answer then reports the cost the choice really has).
        cache: reshard's estimates, kept across searches.
        block: search in blocks of this many layers (:func:`blocks`); default 1 up to
            :data:`MAX_BLOCKS` layers, else ``ceil(L / MAX_BLOCKS)``. The answer is
            exact for the objective over stage boundaries between blocks, and its time
            is the objective of its stages on the layers themselves.
        time_limit: the most seconds the search may take (None: no limit).

    Raises:
        SearchError: no layers, a layer without candidates, an irregular cluster, no
            stages that use every device, none within the memory limit, or the time
            limit spent (naming the phase it was spent in).
    """
    return best_few(layers, cluster, microbatches, 1, schedule=schedule,
                    memory_limit=memory_limit, moves=moves, cache=cache, block=block,
                    time_limit=time_limit)[0]


def best_few(layers: Sequence[Layer], cluster: Cluster, microbatches: int, count: int, *,
             schedule: str = "1f1b", memory_limit: int | None = None,
             moves: str = "priced", cache: CostCache | None = None,
             block: int | None = None, bound: float | None = None,
             time_limit: float | Budget | None = None) -> list[Choice]:
    """:func:`search_chain`'s best answer first, then up to ``count - 1`` more: the
    least-sum stages under each other bound on the slowest stage's period that could
    still be among the best ``count`` (each the best choice whose slowest stage is that
    bound's), best objective first, among the choices no slower than the one made with
    moves free (priced: it bounds the search, whose stages that alone would take longer
    are never priced), or than ``bound`` seconds where given (a search whose objective
    is another, :func:`reshard.search.search_graph`'s, gives its own). The pipeline
    simulator re-ranks them (:func:`reshard.search.rerank`). Other arguments and errors
    as :func:`search_chain`'s."""
    sched = parse_choice_name(schedule, SCHEDULES, "schedule")
    how = parse_choice_name(moves, MOVES, "moves")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SearchError(f"count must be an integer >= 1, got {count!r}")
    budget = Budget.of(time_limit)
    _check(layers, cluster, microbatches)
    size = block if block is not None else max(1, -(-len(layers) // MAX_BLOCKS))
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise SearchError(f"block must be an integer >= 1, got {block!r}")
    costs = MoveCosts(cluster, how == "free", cache if cache is not None else CostCache())
    if size > 1:
        merged, firsts, runs = blocks(layers, size)
        got = best_few(merged, cluster, microbatches, count, schedule=sched,
                       memory_limit=memory_limit, moves=moves, cache=costs.cache, block=1,
                       bound=bound, time_limit=budget)
        return [evaluate(layers, _expand(c.stages, runs, firsts, len(layers)), cluster,
                         microbatches, sched, costs) for c in got]
    limit = math.inf if memory_limit is None else memory_limit
    if bound is None and how == "priced":
        bound = math.inf
        # the choice made with moves free, priced, bounds the answer: a stage that
        # alone takes longer over B - 1 microbatches is in no better choice (its moves
        # are never priced)
        free = _dp(layers, cluster, microbatches, sched, limit,
                   MoveCosts(cluster, True, costs.cache), 1, budget=budget)
        if free:
            bound = evaluate(layers, _path_stages(free[0]), cluster, microbatches, sched,
                             costs).time
    found = _dp(layers, cluster, microbatches, sched, limit, costs, count,
                math.inf if bound is None else bound, budget)
    if not found:
        shapes = sorted({s for layer in layers for s in layer.candidates})
        raise SearchError(
            f"no stages use all {len(cluster.devices)} devices: the layers' submesh shapes "
            f"{shapes} cannot tile the cluster"
            + ("" if memory_limit is None else f" within {memory_limit} bytes per device"))
    out = []
    for path in found:
        stages = _path_stages(path)
        out.append(evaluate(layers, stages, cluster, microbatches, sched, costs)
                   if how == "free" else objective(stages, microbatches, sched))
    return sorted(out, key=lambda c: c.time)


def _path_stages(path: Sequence[tuple[_Option, float]]) -> tuple[Stage, ...]:
    """The DP's stage options and their moves in as stages."""
    return tuple(Stage(o.first, o.last, o.placement, o.names, o.compute,
                       o.inner - o.compute, m) for o, m in path)


def _expand(stages: Sequence[Stage], runs: dict[tuple[int, Shape, str], tuple[str, ...]],
            firsts: Sequence[int], n: int) -> list[Stage]:
    """Stages over blocks (first layers ``firsts`` of ``n``; ``runs``: what each block
    candidate runs, :func:`blocks`) as stages over the layers (unpriced)."""
    ends = [*firsts[1:], n]
    return [Stage(firsts[st.first], ends[st.last] - 1, st.placement,
                  tuple(name for k, block in enumerate(st.choices)
                        for name in runs[(st.first + k, st.placement.shape, block)]),
                  0.0, 0.0, 0.0) for st in stages]


_Key = tuple[int, int, int]
"""A DP state: the next layer, the next device, how the stage before ends (an exit id;
-1: no stage before)."""

_Trans = dict[_Key, tuple[list[float], list[tuple[float, _Key, int]]]]
"""Per state its transitions by period: the periods (increasing), and per transition
the stage's time with its move in, the state after, and the option (an index)."""


def _dp(layers: Sequence[Layer], cluster: Cluster, microbatches: int, sched: str,
        limit: float, costs: MoveCosts, count: int, bound: float = math.inf,
        budget: Budget | None = None) -> list[tuple[tuple[_Option, float], ...]]:
    """The DP of the module docstring: the best ``count`` answers over the bounds (each
    bound's least sum), as paths of (stage option, its move in), among those whose
    every stage's time over ``B - 1`` microbatches is within ``bound``."""
    options = _all_options(layers, cluster, costs, limit)
    # every stage option after every way the stage before can end (its submesh and
    # output layout, as an id), with the move between them: priced once
    flat = [o for opts in options.values() for o in opts
            if (microbatches - 1) * o.inner <= bound]
    budget = Budget(None) if budget is None else budget
    moved, exit_of = _moves_in(flat, layers, costs, budget)
    trans = _transitions(flat, moved, exit_of, sched)
    done = (len(layers), len(cluster.devices))
    # the bounds to try: every period a stage could have, in increasing order; a bound
    # whose least possible objective (the least sum of all, plus (B - 1) times it) is
    # no better than the count-th best so far stops
    caps = sorted({p for periods, _ in trans.values() for p in periods})
    floor, _ = _best_sum(trans, done, math.inf)
    found: dict[tuple, tuple[float, tuple[tuple[_Option, float], ...]]] = {}
    best: list[float] = []  # the least ``count`` values so far, increasing
    for tried, cap in enumerate(caps):
        budget.check(f"bounding the slowest stage ({tried} of {len(caps)} bounds tried)")
        if len(best) == count and floor + (microbatches - 1) * cap >= best[-1]:
            break
        s, picks = _best_sum(trans, done, cap)
        if not picks:
            continue
        path, prev = [], -1
        for k in picks:
            path.append((flat[k], moved[(prev, k)]))
            prev = exit_of[k]
        which = tuple((o.first, o.last, o.placement, o.names) for o, _ in path)
        value = s + (microbatches - 1) * cap
        if which not in found or value < found[which][0]:
            found[which] = (value, tuple(path))
            bisect.insort(best, value)
            del best[count:]
    return [path for _, path in sorted(found.values(), key=lambda vp: vp[0])[:count]]


def _all_options(layers: Sequence[Layer], cluster: Cluster, costs: MoveCosts,
                 limit: float) -> dict[tuple[int, int], list[_Option]]:
    """Every stage option by (first layer, first device)."""
    shapes = sorted({s for layer in layers for s in layer.candidates})
    options: dict[tuple[int, int], list[_Option]] = {}
    for d in range(len(cluster.devices)):
        for shape in shapes:
            p = placements(cluster, shape, d)
            if p is None:
                continue
            for i in range(len(layers)):
                options.setdefault((i, d), []).extend(_stage_options(layers, p, i, costs,
                                                                     limit))
    if not any(options.values()):
        raise SearchError(
            "no stage fits: every layer's candidates exceed the memory limit of "
            f"{limit} bytes per device, or no submesh shape fits the cluster")
    return options


def _moves_in(flat: list[_Option], layers: Sequence[Layer], costs: MoveCosts,
              budget: Budget) -> tuple[dict[tuple[int, int], float], list[int]]:
    """The move into each stage option from every way the stage before can end, priced
    once: ``{(exit id, option): seconds}`` (exit -1: the first stage, no move), and
    each option's own exit id."""
    at: dict[tuple[int, int], list[int]] = {}
    exit_id: dict[tuple[Placement, Candidate], int] = {}
    exit_of: list[int] = []
    ends: dict[tuple[int, int], set[int]] = {}
    for k, o in enumerate(flat):
        at.setdefault((o.first, o.placement.first), []).append(k)
        e = exit_id.setdefault((o.placement, o.exit), len(exit_id))
        exit_of.append(e)
        ends.setdefault((o.last + 1, o.placement.first + o.placement.size), set()).add(e)
    exits = list(exit_id)
    moved: dict[tuple[int, int], float] = {}
    for n_at, ((i, d), ks) in enumerate(at.items()):
        budget.check(f"pricing the moves into stages ({n_at} of {len(at)} stage starts "
                     f"done, {costs.asked} estimates asked)")
        for k in ks:
            o = flat[k]
            if i == 0:
                moved[(-1, k)] = 0.0
                continue
            before = layers[i - 1]
            for e in ends.get((i, d), ()):
                place, cand = exits[e]
                moved[(e, k)] = costs.move(before.output_shape, before.dtype, place,
                                           cand.output, o.placement, o.entry.input)
    return moved, exit_of


def _transitions(flat: list[_Option], moved: dict[tuple[int, int], float],
                 exit_of: list[int], sched: str) -> _Trans:
    """Per state its transitions (:data:`_Trans`), by period, so that a bound takes a
    prefix."""
    moves_out: dict[_Key, list[tuple[float, float, _Key, int]]] = {}
    for (prev, k), m in moved.items():
        o = flat[k]
        moves_out.setdefault((o.first, o.placement.first, prev), []).append(
            (period(sched, o.inner, m), o.inner + m,
             (o.last + 1, o.placement.first + o.placement.size, exit_of[k]), k))
    trans: _Trans = {}
    for key, ts in moves_out.items():
        ts.sort(key=lambda t: t[0])
        trans[key] = ([t[0] for t in ts], [(t[1], t[2], t[3]) for t in ts])
    return trans


def _best_sum(trans: _Trans, done: tuple[int, int], cap: float) -> tuple[float, list[int]]:
    """The least sum of stage times over stages whose periods are all within ``cap``,
    and its options (none: no such stages)."""
    memo: dict[_Key, tuple[float, _Key | None, int]] = {}

    def f(key: _Key) -> float:
        got = memo.get(key)
        if got is not None:
            return got[0]
        if key[:2] == done:
            memo[key] = (0.0, None, -1)
            return 0.0
        best, after, pick = math.inf, None, -1
        here = trans.get(key)
        if here is not None:
            periods, steps = here
            for j in range(bisect.bisect_right(periods, cap)):
                cost, nxt, k = steps[j]
                if cost >= best:
                    continue
                total_here = cost + f(nxt)
                if total_here < best:
                    best, after, pick = total_here, nxt, k
        memo[key] = (best, after, pick)
        return best

    start: _Key = (0, 0, -1)
    value = f(start)
    path = []
    key: _Key | None = start
    while key is not None and math.isfinite(value):
        _, key, pick = memo[key]
        if pick >= 0:
            path.append(pick)
    return value, path


__all__ = ["MAX_BLOCKS", "MOVES", "SCHEDULES", "best_few", "blocks", "chain_edges", "evaluate",
           "named_candidates", "objective", "period", "price", "search_chain", "stage_index"]

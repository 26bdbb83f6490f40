"""The stage DP of :mod:`reshard.search.chain`: the least sum of stage times under each
bound on the slowest stage's period, every bound at once.

A state is (next layer, next device, how the stage before ends: its submesh and output
layout, as an exit id, -1 for none; and how many stages are still to come, itself
included, where a stage's in-flight count decides whether it fits the memory limit, 0
otherwise). A transition is a stage option (:class:`Option`) taken from a state, at the
option's time plus the move into it from that exit, with the period the schedule gives
those two. For a bound ``t`` on the period, the least sum ``S(t)`` over the
transitions of period within ``t`` is a shortest path in a DAG; the answer is the
least ``T(S(t), t)`` (:func:`reshard.search.objective.total`, increasing in both).

With virtual stages the devices are slots: piece ``j`` of a submesh of ``n`` devices
takes slots ``j n`` to ``(j + 1) n - 1``, the options of each piece placed on its
submesh (:attr:`Option.at`), its in-flight count known from ``j``
(:class:`Holding`).

Rather than solving each bound afresh (Alpa's way), the transitions enter in
increasing period and each entry lowers the distances it can (a key's distance depends
only on keys of later layers, so the updates run latest layer first): every bound's
``S(t)`` for about the cost of one. Bounds stop once the least sum of all plus
``(B - 1) t`` is no better than the best found. Only states reachable from the start
that can reach the end are priced. Moves are priced on submeshes shifted by whole hosts
to the cluster's first (the same estimate: its normal form drops the hosts it does not
touch), so each distinct move is asked once.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from reshard.search.costs import MoveCosts
from reshard.search.model import Budget, Layer, Placement, Stage
from reshard.search.objective import period, total
from reshard.search.options import Links, Option

Key = tuple[int, int, int, int]
"""A state: the next layer, the next device (slot), the exit id of the stage before,
the stages still to come (0: not counted)."""

Path = tuple[tuple[Option, float], ...]
"""A DP answer: its stage options and each one's move in."""


def shifted(costs: MoveCosts, per_host: int, layer: Layer, src: Placement, src_spec: str,
            dst: Placement, dst_spec: str) -> float:
    """``costs.move`` of ``layer``'s output with both submeshes shifted by whole hosts
    so that the first starts on the cluster's first host (module docstring)."""
    base = (min(src.first, dst.first) // per_host) * per_host
    if base:
        src, dst = Placement(src.shape, src.first - base), Placement(dst.shape, dst.first - base)
    return costs.move(layer.output_shape, layer.dtype, src, src_spec, dst, dst_spec)


@dataclass(frozen=True)
class Holding:
    """What decides whether a stage option fits the memory limit where the DP takes it.

    Attributes:
        limit: bytes per device a stage (piece) may hold (inf: none).
        counts: a one-chunk pipeline's in-flight count with ``k`` stages to go, at
            ``counts[k - 1]`` for ``k`` up to ``len(counts) - 1``; the last for every
            ``k`` beyond (empty: no count matters; the states count no stages).
        slots: with virtual stages, per piece's first slot its in-flight count.
        chunks: pieces per submesh (the objective's ``v``).
    """

    limit: float = math.inf
    counts: tuple[int, ...] = ()
    slots: dict[int, int] | None = None
    chunks: int = 1

    def steps(self, o: Option, at: int, room: int) -> list[tuple[int, int]]:
        """The (stages to go before, after) of every state that may take ``o`` at
        slot ``at``, where at most ``room`` stages can still come."""
        if self.slots is not None:
            return [(0, 0)] if o.fits(self.limit, self.slots[at]) else []
        top = len(self.counts) - 1
        if top <= 0:
            return [(0, 0)]
        out = [(k, k - 1) for k in range(1, min(top, room) + 1)
               if o.fits(self.limit, self.counts[k - 1])]
        if room > top and o.fits(self.limit, self.counts[top]):
            out += [(top + 1, top + 1), (top + 1, top)]
        return out

    def starts(self) -> list[int]:
        """The stages-to-go a path may start with."""
        top = len(self.counts) - 1
        return [0] if self.slots is not None or top <= 0 else list(range(1, top + 2))


@dataclass
class _Graph:
    """The DAG: transitions ``(period, cost, from, to, option, move)``, the options and
    the stage counts a path may start with."""

    options: list[Option]
    trans: list[tuple[float, float, Key, Key, int, float]]
    starts: list[int]
    chunks: int = 1


def _live(options: Sequence[Option], devices: int, n: int
          ) -> tuple[list[Option], dict[tuple[int, int], list[int]]]:
    """The options on some path from (layer 0, device 0) to (layer n, device D), and
    per (layer, device) the live options starting there."""
    at: dict[tuple[int, int], list[int]] = {}
    for k, o in enumerate(options):
        at.setdefault((o.first, o.start), []).append(k)
    ahead: set[tuple[int, int]] = {(n, devices)}  # positions that reach the end
    for pos in sorted(at, reverse=True):
        if any((options[k].last + 1, options[k].start + options[k].placement.size)
               in ahead for k in at[pos]):
            ahead.add(pos)
    seen, todo = {(0, 0)}, [(0, 0)]
    keep: list[int] = []
    while todo:
        pos = todo.pop()
        for k in at.get(pos, ()):
            o = options[k]
            nxt = (o.last + 1, o.start + o.placement.size)
            if nxt in ahead:
                keep.append(k)
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
    live = [options[k] for k in sorted(keep)]
    by: dict[tuple[int, int], list[int]] = {}
    for k, o in enumerate(live):
        by.setdefault((o.first, o.start), []).append(k)
    return live, by


def build(options: Sequence[Option], layers: Sequence[Layer], devices: int, per_host: int,
          schedule: str, microbatches: int, costs: MoveCosts, bound: float,
          budget: Budget, links: Links = None, holding: Holding | None = None) -> _Graph:
    """The DAG's transitions whose period over ``B - 1`` microbatches is within
    ``bound``, every move in priced once; ``holding``: where each option fits the
    memory limit (default: everywhere)."""
    holding = Holding() if holding is None else holding
    live, at = _live(options, devices, len(layers))
    exit_id: dict[tuple[Placement, str], int] = {}
    exit_of = [exit_id.setdefault((o.placement, o.exit), len(exit_id)) for o in live]
    exits = list(exit_id)
    ends: dict[tuple[int, int], set[int]] = {}
    for k, o in enumerate(live):
        ends.setdefault((o.last + 1, o.start + o.placement.size), set()).add(exit_of[k])
    trans: list[tuple[float, float, Key, Key, int, float]] = []
    b1 = microbatches - 1
    smallest = min((o.placement.size for o in live), default=1)
    steps = [holding.steps(o, o.start, min(len(layers) - o.first, (devices - o.start) // smallest))
             for o in live]
    for n_at, ((i, d), ks) in enumerate(sorted(at.items())):
        budget.check("pricing the moves into stages ({} of {} stage starts done, {} "
                     "estimates asked)", n_at, len(at), costs.asked)
        froms = [-1] if i == 0 else sorted(ends.get((i, d), ()))
        for e in froms:
            for k in ks:
                o = live[k]
                if e < 0 or (links is not None and i - 1 not in links):
                    m = 0.0
                else:
                    place, spec = exits[e]
                    m = shifted(costs, per_host, layers[i - 1], place, spec, o.placement,
                                o.entry)
                p = period(schedule, o.inner, m)
                if b1 * p <= bound:
                    nxt = (o.last + 1, d + o.placement.size, exit_of[k])
                    trans.extend((p, o.inner + m, (i, d, e, before), (*nxt, after), k, m)
                                 for before, after in steps[k])
    trans.sort(key=lambda t: t[0])
    return _Graph(live, trans, holding.starts(), holding.chunks)


def _floor(g: _Graph, done: tuple[int, int]) -> float:
    """The least sum with every transition (no bound on the period)."""
    dist: dict[Key, float] = {}
    for _, cost, u, v, _, _ in sorted(g.trans, key=lambda t: (t[3][0], t[3][1]),
                                      reverse=True):
        got = 0.0 if _done(v, done) else dist.get(v, math.inf)
        if cost + got < dist.get(u, math.inf):
            dist[u] = cost + got
    return min(dist.get((0, 0, -1, k), math.inf) for k in g.starts)


def _done(key: Key, done: tuple[int, int]) -> bool:
    """Whether ``key`` is the end: every layer on every device, no stage to come."""
    return key[0] == done[0] and key[1] == done[1] and key[3] == 0


def best_paths(g: _Graph, done: tuple[int, int], microbatches: int, count: int,
               budget: Budget) -> list[Path]:
    """The best ``count`` answers over the bounds (each bound's least sum, a distinct
    choice of stages), best first (module docstring)."""
    starts: list[Key] = [(0, 0, -1, k) for k in g.starts]
    dist: dict[Key, float] = {}
    ptr: dict[Key, tuple[Key, int, float]] = {}
    preds: dict[Key, list[tuple[Key, float, int, float]]] = {}
    floor = _floor(g, done)
    found: dict[tuple, tuple[float, Path]] = {}
    best: list[float] = []
    j, n = 0, len(g.trans)

    def value(key: Key) -> float:
        return 0.0 if _done(key, done) else dist.get(key, math.inf)

    while j < n:
        cap = g.trans[j][0]
        budget.check("bounding the slowest stage ({} of {} transitions in)", j, n)
        if len(best) == count and total(floor, cap, microbatches, g.chunks) >= best[-1]:
            break
        heap: list[tuple[int, int, Key]] = []
        while j < n and g.trans[j][0] == cap:
            _, cost, u, v, k, m = g.trans[j]
            j += 1
            preds.setdefault(v, []).append((u, cost, k, m))
            if cost + value(v) < dist.get(u, math.inf):
                dist[u], ptr[u] = cost + value(v), (v, k, m)
                heapq.heappush(heap, (-u[0], -u[1], u))
        pops = 0
        while heap:
            _, _, v = heapq.heappop(heap)
            pops += 1
            if pops % 4096 == 0:
                budget.check("bounding the slowest stage ({} of {} transitions in)", j, n)
            for u, cost, k, m in preds.get(v, ()):
                if cost + dist[v] < dist.get(u, math.inf):
                    dist[u], ptr[u] = cost + dist[v], (v, k, m)
                    heapq.heappush(heap, (-u[0], -u[1], u))
        start = min(starts, key=lambda key: dist.get(key, math.inf))
        if start not in dist:
            continue
        path, key = [], start
        while not _done(key, done):
            key, k, m = ptr[key]
            path.append((g.options[k], m))
        which = tuple((o.first, o.last, o.placement, o.trail) for o, _ in path)
        got = total(dist[start], cap, microbatches, g.chunks)
        if which not in found or got < found[which][0]:
            found[which] = (got, tuple(path))
            best = sorted(v for v, _ in found.values())[:count]
    return [p for _, p in sorted(found.values(), key=lambda vp: vp[0])[:count]]


def path_stages(path: Path) -> tuple[Stage, ...]:
    """A DP answer as stages."""
    return tuple(Stage(o.first, o.last, o.placement, o.names, o.compute, o.inner - o.compute,
                       m) for o, m in path)


__all__ = ["Holding", "Key", "Path", "best_paths", "build", "path_stages", "shifted"]

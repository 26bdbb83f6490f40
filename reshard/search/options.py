"""The stages a chain DP may take, and layers merged into blocks: a run of consecutive
layers on one submesh, its candidates chosen by a chain DP over (layer, candidate).

A stage's inner time is its layers' compute plus the moves between its own layers
(each priced by reshard on the stage's submesh). Per (first candidate, last candidate)
the DP keeps the Pareto front of (time, memory, activations): a path's bytes per device
are its memory plus the stage's in-flight count times its activations
(:mod:`reshard.search.memory`), so a memory limit per device is met exactly at every
count; with no limit the front is the least time alone. A stage option is each entry of
a front that is the fastest within the limit at some in-flight count. A path's names are a trail
(each entry points at the one before), so extending a stage by a layer costs the same
however long it is.

Symmetry: a stage's options on two submeshes of one shape whose first devices sit at
the same place on their hosts (``first % devices per host``) are the same up to the
placement: reshard's estimate of a move is that of its normal form, which keeps a
device's place on its host and drops the hosts it does not touch. They are built once
per such class and placed (:func:`place_class`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from reshard.search.costs import MoveCosts
from reshard.search.model import Budget, Layer, Placement

Trail = tuple[str, "Trail"] | None
"""A path's candidate names, last first (``(name, the trail before)``)."""

Entry = tuple[float, int, int, float, Trail]
"""A path through a stage's layers: (inner time, memory per device, activations per
device and microbatch in flight, compute, trail)."""


@dataclass(frozen=True)
class Option:
    """A stage the DP may take: layers ``first..last`` on ``placement``, entered in
    layout ``entry`` (its first candidate's input), left in layout ``exit`` (its last
    candidate's output), at ``inner`` seconds per microbatch (compute and inner moves,
    ``compute`` of it) through the candidates ``trail`` names, holding ``memory`` bytes
    per device and ``activations`` more per microbatch in flight; ``at``: where the DP
    places it (its first device, or with virtual stages its piece's first slot: -1,
    the placement's first device)."""

    first: int
    last: int
    placement: Placement
    entry: str
    exit: str
    inner: float
    compute: float
    trail: Trail
    memory: int = 0
    activations: int = 0
    at: int = -1

    @property
    def names(self) -> tuple[str, ...]:
        """The candidates' names, first layer first."""
        return names_of(self.trail)

    @property
    def start(self) -> int:
        """Its first position in the DP (:attr:`at`, else the placement's first device)."""
        return self.placement.first if self.at < 0 else self.at

    def fits(self, limit: float, in_flight: int) -> bool:
        """Whether it holds at most ``limit`` bytes per device with ``in_flight``
        microbatches' activations."""
        return self.memory + in_flight * self.activations <= limit


def names_of(trail: Trail) -> tuple[str, ...]:
    """A trail's names, first first."""
    out: list[str] = []
    while trail is not None:
        name, trail = trail
        out.append(name)
    return tuple(reversed(out))


MAX_FRONT = 8
"""The most entries a front keeps: the least time, the least memory and ones evenly
spread between (exact while a front is smaller, as on every instance the tests check
against brute force; a long chain of layers of two kinds under a memory limit would
otherwise keep a front as long as the chain)."""


def pareto(entries: list[Entry], memory: bool = True) -> list[Entry]:
    """The entries no other beats in time, memory and activations alike, least time
    first, at most :data:`MAX_FRONT` (with ``memory`` False: the least time alone)."""
    if not memory:
        return [min(entries, key=lambda e: (e[0], e[1], e[2]))]
    out: list[Entry] = []
    # the kept entries' (memory, activations) skyline, memory up and so activations
    # down: an entry (no faster than any kept) is beaten iff the skyline's entry of
    # the most memory within its own holds no more activations
    mems: list[int] = []
    acts: list[int] = []
    for e in sorted(entries, key=lambda e: (e[0], e[1], e[2])):
        k = bisect.bisect_right(mems, e[1])
        if k and acts[k - 1] <= e[2]:
            continue
        out.append(e)
        k -= bool(k and mems[k - 1] == e[1])
        j = k
        while j < len(mems) and acts[j] >= e[2]:
            j += 1
        mems[k:j], acts[k:j] = [e[1]], [e[2]]
    if len(out) > MAX_FRONT:
        last = len(out) - 1
        out = [out[round(k * last / (MAX_FRONT - 1))] for k in range(MAX_FRONT)]
    return out


Links = frozenset[int] | None
"""Which layers feed the next one (``k``: layer ``k``'s output is layer ``k + 1``'s
input); None: every one (a chain). A graph's layers in order may skip: between two
layers not joined there is no move."""

Fronts = dict[tuple[str, str], list[Entry]]
"""Per (entry layout, current output layout), the Pareto front of the paths to it (the
moves before and after a path depend on those two alone)."""


def paths(layers: Sequence[Layer], p: Placement, first: int, costs: MoveCosts,
          limit: float, budget: Budget, stop: int | None = None,
          cap: float = math.inf, links: Links = None) -> Iterator[tuple[int, Fronts]]:
    """Per last layer (``first`` up to ``stop``, default the chain's end), the fronts of
    the paths from layer ``first`` to it on ``p`` within ``limit`` bytes per device;
    paths whose inner time passes ``cap`` are dropped (their extensions only grow).
    ``links``: :data:`Links`."""
    shape, keep_memory = p.shape, math.isfinite(limit)
    end = len(layers) - 1 if stop is None else stop
    fronts: Fronts = {}
    for c in layers[first].candidates.get(shape, ()):
        if c.memory + c.activations <= limit and c.compute <= cap:
            fronts.setdefault((c.input, c.output), []).append(
                (c.compute, c.memory, c.activations, c.compute, (c.name, None)))
    fronts = {k: pareto(v, keep_memory) for k, v in fronts.items()}
    for last in range(first, end + 1):
        if not fronts:
            return
        yield last, fronts
        if last == end:
            return
        before, layer = layers[last], layers[last + 1]
        grown: dict[tuple[str, str], list[Entry]] = {}
        for c in layer.candidates.get(shape, ()):
            budget.check("building the stages of layers {}.. on {} (at layer {})",
                         first, p.shape, last + 1)
            for (entry, out), front in fronts.items():
                step = c.compute + (costs.move(before.output_shape, before.dtype, p,
                                               out, p, c.input)
                                    if links is None or last in links else 0.0)
                got = [(t + step, mem + c.memory, act + c.activations, comp + c.compute,
                        (c.name, trail))
                       for t, mem, act, comp, trail in front
                       if mem + c.memory + act + c.activations <= limit and t + step <= cap]
                if got:
                    grown.setdefault((entry, c.output), []).extend(got)
        fronts = {k: pareto(v, keep_memory) for k, v in grown.items()}


def stage_options(layers: Sequence[Layer], p: Placement, first: int, costs: MoveCosts,
                  limit: float, budget: Budget, cap: float = math.inf,
                  links: Links = None, enough: float = math.inf,
                  stop: int | None = None) -> list[Option]:
    """Every (last layer, entry, exit) of a stage starting at layer ``first`` on ``p``
    (its last at most ``stop``, default the chain's end): per in-flight count up to
    ``enough`` (the most it can have), the least time of its paths within ``limit``
    bytes per device (:func:`staircase`), none whose inner time passes ``cap``."""
    out = []
    for last, fronts in paths(layers, p, first, costs, limit, budget, stop, cap, links):
        for (entry, exit_), front in fronts.items():
            for t, mem, act, comp, trail in staircase(front, limit, enough):
                out.append(Option(first, last, p, entry, exit_, t, comp, trail, mem, act))
    return out


def most_in_flight(memory: int, activations: int, limit: float) -> float:
    """The most microbatches in flight a path of ``memory`` and ``activations`` bytes
    holds within ``limit`` (inf: any number)."""
    if activations == 0 or not math.isfinite(limit):
        return math.inf
    return (limit - memory) // activations


def staircase(front: Sequence[Entry], limit: float, enough: float = math.inf) -> list[Entry]:
    """The entries of a front (least time first) that are the fastest within ``limit``
    at some in-flight count up to ``enough``: each holds more microbatches than every
    faster one."""
    out: list[Entry] = []
    most = -math.inf
    for e in front:
        n = most_in_flight(e[1], e[2], limit)
        if n > most:
            out.append(e)
            most = n
        if most >= enough:
            break
    return out


def place_class(options: Sequence[Option], p: Placement) -> list[Option]:
    """Options built on a submesh of ``p``'s class (module docstring), placed on ``p``."""
    return [o if o.placement == p else
            Option(o.first, o.last, p, o.entry, o.exit, o.inner, o.compute, o.trail, o.memory,
                   o.activations)
            for o in options]


__all__ = ["MAX_FRONT", "Entry", "Fronts", "Links", "Option", "Trail", "most_in_flight",
           "names_of", "pareto", "paths", "place_class", "stage_options", "staircase"]

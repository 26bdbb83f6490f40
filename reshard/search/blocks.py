"""Layers merged into blocks of consecutive layers, so that a long chain's stage DP
runs over fewer positions (Alpa's layer clustering): stage boundaries fall between
blocks; inside a block every layer keeps its own candidate.

A block candidate is a path through the block's layers on one submesh shape (a
candidate per layer, the moves between them priced by reshard on the shape's first
submesh): per (first candidate, last candidate), the Pareto front of (time, memory,
activations)
(:func:`reshard.search.options.paths`, the stage DP's own). It takes the first
layer's input layout and gives the last layer's output; its compute is the path's
time, moves included. A MoE block of a dense and an expert layer so keeps dense dp
with expert parallel, and alternating layouts cost only their moves.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Sequence

from reshard.search.costs import MoveCosts
from reshard.search.model import (
    Budget,
    Candidate,
    Layer,
    Shape,
    Stage,
    checked_already,
    placements,
)
from reshard.search.options import Links, names_of, paths

Runs = dict[tuple[int, Shape, str], tuple[str, ...]]
"""Per (block, submesh shape, block candidate's name), the layers' candidates' names."""


def _block_candidates(part: Sequence[Layer], shape: Shape, costs: MoveCosts,
                      limit: float, budget: Budget, index: int, runs: Runs,
                      links: Links = None) -> tuple[Candidate, ...]:
    got: list[Candidate] = []
    place = placements(costs.cluster, shape, 0)
    if place is None:
        return ()
    reached = deque(paths(part, place, 0, costs, limit, budget, links=links),
                    maxlen=1)  # the last
    if not reached:
        return ()
    last, fronts = reached[0]
    if last != len(part) - 1:
        return ()
    for (entry, exit_), front in fronts.items():
        for t, mem, act, _, trail in front:
            names = names_of(trail)
            name = names[0] if len(set(names)) == 1 else "+".join(names)
            while (index, shape, name) in runs:
                name += "'"
            runs[(index, shape, name)] = names
            got.append(checked_already(Candidate, name=name, compute=t, input=entry,
                                       output=exit_, memory=mem, grads=0, activations=act))
    return tuple(got)


def blocks(layers: Sequence[Layer], size: int, costs: MoveCosts, limit: float = math.inf,
           budget: Budget | None = None, links: Links = None,
           only: Collection[Shape] | None = None
           ) -> tuple[list[Layer], list[int], Runs, Links]:
    """``layers`` in blocks of ``size`` consecutive layers (the last takes the rest):
    the blocks as layers (module docstring; their candidates on the shapes ``only``
    where given), each block's first layer, what each block candidate runs on its
    layers, and which blocks feed the next (:data:`Links`)."""
    budget = Budget(None) if budget is None else budget
    merged: list[Layer] = []
    firsts: list[int] = []
    runs: Runs = {}
    for a in range(0, len(layers), size):
        part = layers[a:a + size]
        shapes = sorted(set.intersection(*(set(layer.candidates) for layer in part))
                        & (set(only) if only is not None else set(part[0].candidates)))
        cands = {}
        for shape in shapes:
            inside = None if links is None else frozenset(
                k - a for k in links if a <= k < a + len(part) - 1)
            got = _block_candidates(part, shape, costs, limit, budget, len(merged), runs,
                                    inside)
            if got:
                cands[shape] = got
        merged.append(checked_already(Layer, name=f"{part[0].name}..{part[-1].name}",
                                      output_shape=part[-1].output_shape,
                                      dtype=part[-1].dtype, candidates=cands))
        firsts.append(a)
    joined = None if links is None else frozenset(
        j for j in range(len(firsts) - 1) if firsts[j + 1] - 1 in links)
    return merged, firsts, runs, joined


def expand(stages: Sequence[Stage], runs: Runs, firsts: Sequence[int], n: int) -> list[Stage]:
    """Stages over blocks (first layers ``firsts`` of ``n``; ``runs``: what each block
    candidate runs, :func:`blocks`) as stages over the layers (unpriced)."""
    ends = [*firsts[1:], n]
    return [Stage(firsts[st.first], ends[st.last] - 1, st.placement,
                  tuple(name for k, block in enumerate(st.choices)
                        for name in runs[(st.first + k, st.placement.shape, block)]),
                  0.0, 0.0, 0.0) for st in stages]


__all__ = ["Runs", "blocks", "expand"]

"""Virtual stages: several pieces of the chain on one submesh (interleaved 1F1B, ZB-V,
DualPipeV), searched by the stage DP of :mod:`reshard.search.stagedp`.

Every submesh of a virtual-stage pipeline has one shape, as Megatron and torch place
them (a pipeline rank per submesh): ``p = D / n`` submeshes of ``n`` devices, the
``k``-th at device ``k n``. Piece ``j`` of the ``v p`` pieces (in pipeline order) runs
on submesh ``j mod p`` (interleaved) or, on a V, on ``j`` going down and ``2 p - 1 - j``
coming back up. The DP walks the pieces as it walks devices for one-chunk stages:
piece ``j`` takes slots ``j n`` to ``(j + 1) n - 1`` of ``v D`` slots, and its options
are its submesh's, held to ``1 / v`` of the memory limit at the piece's in-flight
count (:mod:`reshard.search.memory`), so the submesh's ``v`` pieces together fit it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from reshard.cluster import Cluster
from reshard.search.kinds import SearchSchedule
from reshard.search.memory import Orders, in_flight
from reshard.search.model import Layer, Placement, Shape, devices, placements
from reshard.search.options import Option
from reshard.search.stagedp import Holding


def piece_submeshes(schedule: SearchSchedule, submeshes: int, chunks: int) -> list[int]:
    """Per piece, in pipeline order, the index of the submesh that runs it."""
    p = submeshes
    if schedule.traits.placement == "v":
        return [j if (j // p) % 2 == 0 else p - 1 - j % p for j in range(p * chunks)]
    return [j % p for j in range(p * chunks)]


def virtual_shapes(layers: Sequence[Layer], cluster: Cluster, schedule: SearchSchedule,
                   chunks: int, microbatches: int) -> list[tuple[Shape, list[Placement]]]:
    """The submesh shapes a virtual-stage pipeline of ``layers`` may take on ``cluster``
    (every submesh of one shape, tiling the devices in order; at least one layer per
    piece; DualPipeV: at least two microbatches per submesh), each with its submeshes."""
    total = devices(cluster)
    out = []
    for shape in sorted({s for layer in layers for s in layer.candidates}):
        size = shape[0] * shape[1]
        if total % size:
            continue
        p = total // size
        if p * chunks > len(layers) or microbatches < schedule.traits.fewest * p:
            continue
        places = [placements(cluster, shape, k * size) for k in range(p)]
        if all(pl is not None for pl in places):
            out.append((shape, [pl for pl in places if pl is not None]))
    return out


def place_pieces(options: Sequence[Option], places: Sequence[Placement],
                 schedule: SearchSchedule, chunks: int) -> list[Option]:
    """The options built on ``places`` (one shape), each placed at the slots of every
    piece its submesh runs (module docstring)."""
    order = piece_submeshes(schedule, len(places), chunks)
    size = places[0].size
    index = {pl: k for k, pl in enumerate(places)}
    pieces: dict[int, list[int]] = {}
    for j, k in enumerate(order):
        pieces.setdefault(k, []).append(j)
    return [dataclasses.replace(o, at=j * size)
            for o in options if o.placement in index for j in pieces[index[o.placement]]]


def holding(schedule: SearchSchedule, submeshes: int, chunks: int, microbatches: int,
            limit: float, size: int, orders: Orders | None = None) -> Holding:
    """Each piece's in-flight count by its first slot, and its share of ``limit``."""
    counts = in_flight(schedule, submeshes, chunks, microbatches, orders)
    return Holding(limit / chunks, slots={j * size: n for j, n in enumerate(counts)},
                   chunks=chunks)


__all__ = ["holding", "piece_submeshes", "place_pieces", "virtual_shapes"]

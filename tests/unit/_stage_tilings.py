"""Every way to cut a chain of layers into stages on submeshes that tile a cluster: the
enumeration the search tests' brute forces share (tests only)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from reshard.cluster import Cluster
from reshard.search import placements
from reshard.search.model import Placement, Shape


def stage_tilings(cluster: Cluster, n: int, shapes: Sequence[Shape]
                  ) -> Iterator[tuple[list[tuple[int, int]], list[Placement]]]:
    """Each split of ``n`` layers into runs ``(first, last)`` with a submesh per run, of
    the given ``shapes`` placed one after another, that uses every device of
    ``cluster``."""
    for cuts in itertools.product((False, True), repeat=n - 1):
        bounds, start = [], 0
        for k, cut in enumerate(cuts):
            if cut:
                bounds.append((start, k))
                start = k + 1
        bounds.append((start, n - 1))
        for picked in itertools.product(shapes, repeat=len(bounds)):
            places = tiling(cluster, picked)
            if places is not None:
                yield bounds, places


def tiling(cluster: Cluster, shapes: Sequence[Shape]) -> list[Placement] | None:
    """A submesh of each of ``shapes``, placed one after another from device 0, where
    they place and use every device of ``cluster`` (else None)."""
    places, at = [], 0
    for shape in shapes:
        p = placements(cluster, shape, at)
        if p is None:
            return None
        places.append(p)
        at += p.size
    return places if at == len(cluster.devices) else None

"""What moving an activation costs inside a search: reshard's own estimate, cached.

A move between two layers is its activation going forward and its gradient (the same
shape and dtype) coming back: two estimates (:func:`reshard.planner.estimates.estimate_many`,
the default strategy), kept in one :class:`~reshard.planner.estimates.CostCache` for the
whole search, whose normal form answers the same move between other submeshes of the
same shapes at once. ``free=True`` prices every move at 0: the Alpa-style search that
chooses as if moves cost nothing (its choice is then evaluated with real costs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reshard.cluster import Cluster
from reshard.layout import Layout
from reshard.planner.estimates import CostCache, estimate_many


@dataclass
class MoveCosts:
    """Seconds of a move there and back, per microbatch.

    Attributes:
        cluster: the cluster the moves are planned on.
        free: every move costs 0 (a baseline that ignores moves).
        cache: reshard's estimates, by request.
    """

    cluster: Cluster
    free: bool = False
    cache: CostCache = field(default_factory=CostCache)
    asked: int = 0

    def move(self, shape: tuple[int, ...], dtype: str, src: Layout, dst: Layout) -> float:
        """The activation from ``src`` to ``dst`` and its gradient back."""
        if self.free or src == dst:
            return 0.0
        self.asked += 2
        there, back = estimate_many([(shape, dtype, src, dst, self.cluster),
                                     (shape, dtype, dst, src, self.cluster)],
                                    cache=self.cache)
        return there + back


__all__ = ["MoveCosts"]

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
from reshard.planner.estimates import CostCache, estimate_many
from reshard.search.model import Placement


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
    _known: dict[tuple, tuple[float, float]] = field(default_factory=dict, repr=False)

    def move(self, shape: tuple[int, ...], dtype: str, src: Placement, src_spec: str,
             dst: Placement, dst_spec: str) -> float:
        """The activation from ``src_spec`` on submesh ``src`` to ``dst_spec`` on ``dst``,
        and its gradient back (kept by those six values: a search asks each many
        times)."""
        there, back = self.both(shape, dtype, src, src_spec, dst, dst_spec)
        return there + back

    def both(self, shape: tuple[int, ...], dtype: str, src: Placement, src_spec: str,
             dst: Placement, dst_spec: str) -> tuple[float, float]:
        """:meth:`move`'s two parts: the activation there, the gradient back."""
        if self.free or (src == dst and src_spec == dst_spec):
            return (0.0, 0.0)
        key = (shape, dtype, src, src_spec, dst, dst_spec)
        got = self._known.get(key)
        if got is None:
            self.asked += 2
            a, b = src.layout(src_spec), dst.layout(dst_spec)
            there, back = estimate_many([(shape, dtype, a, b, self.cluster),
                                         (shape, dtype, b, a, self.cluster)],
                                        cache=self.cache)
            got = self._known[key] = (there, back)
        return got


__all__ = ["MoveCosts"]

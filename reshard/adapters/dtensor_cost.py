"""What a cross-mesh DTensor redistribute costs, in the form torch's cost models take.

DTensor's own ``redistribute_cost(current_spec, target_spec)`` (and
meta-pytorch/autoparallel's copy of it) prices a redistribute on one mesh and returns
``inf`` across meshes ("cross mesh communication cost is not quite needed"). A
:class:`CrossMeshCost` is a callable of the same two ``DTensorSpec``s (their ``mesh``,
``placements`` and ``tensor_meta``: shape and dtype), returning the same unit,
microseconds: reshard's model of the plan it would run on a :class:`~reshard.Cluster`,
through :func:`reshard.estimate_many` (normalized, cached). A cost model can call it
where the meshes differ, or for every pair. :func:`request` turns a ``(mesh,
placements)`` pair into an :func:`~reshard.estimate_many` request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from reshard.adapters.dtensor_layout import to_layout
from reshard.core.cluster import Cluster
from reshard.core.dtypes import parse_dtype
from reshard.core.errors import SpecError
from reshard.planner.estimates import CostCache, estimate_many
from reshard.planner.values.strategy import Strategy


def request(shape: Sequence[int], dtype: Any, src: tuple[Any, Sequence[Any]],
            dst: tuple[Any, Sequence[Any]], cluster: Cluster | None = None
            ) -> tuple[Any, ...]:
    """An :func:`reshard.estimate_many` request for moving a tensor of ``shape`` /
    ``dtype`` (a torch dtype or a name) from ``(device_mesh, placements)`` ``src`` to
    ``dst``."""
    shape = tuple(int(n) for n in shape)
    return (shape, parse_dtype(dtype).name, to_layout(src[0], src[1], shape),
            to_layout(dst[0], dst[1], shape), cluster)


def _spec_request(current: Any, target: Any, cluster: Cluster) -> tuple[Any, ...]:
    meta = getattr(current, "tensor_meta", None) or getattr(target, "tensor_meta", None)
    if meta is None:
        raise SpecError("the DTensorSpecs carry no tensor_meta (shape and dtype): give "
                        "one of them its TensorMeta, or use reshard.adapters.dtensor_cost."
                        "request(shape, dtype, ...)")
    return request(meta.shape, meta.dtype, (current.mesh, current.placements),
                   (target.mesh, target.placements), cluster)


class CrossMeshCost:
    """``cost(current_spec, target_spec) -> microseconds`` for DTensorSpecs on any
    meshes (module docstring).

    Args:
        cluster: the machines the meshes' ranks are on (their global ranks are its
            device ids).
        cache: estimates kept across calls (default: this object's own).
        strategy: the plans' strategy (default ``broadcast``, reshard's own).
    """

    def __init__(self, cluster: Cluster, cache: CostCache | None = None,
                 strategy: str | Strategy = Strategy.BROADCAST) -> None:
        if not isinstance(cluster, Cluster):
            raise SpecError(f"cluster must be a reshard.Cluster, got {type(cluster).__name__}")
        self.cluster = cluster
        self.cache = CostCache() if cache is None else cache
        self.strategy = Strategy.parse(strategy)

    def __call__(self, current_spec: Any, target_spec: Any) -> float:
        return self.many([(current_spec, target_spec)])[0]

    def many(self, pairs: Iterable[tuple[Any, Any]]) -> list[float]:
        """Microseconds of each ``(current_spec, target_spec)`` pair, in order (a bad
        pair: :class:`reshard.EstimateError`, with the others' costs in seconds)."""
        reqs = [_spec_request(a, b, self.cluster) for a, b in pairs]
        return [1e6 * s for s in estimate_many(reqs, strategy=self.strategy,
                                               cache=self.cache)]


__all__ = ["CrossMeshCost", "request"]

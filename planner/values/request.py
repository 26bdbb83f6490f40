"""A request to plan: one tensor's ``(shape, dtype, src, dst[, cast])`` or a
:class:`~reshard.planner.values.tasks.TensorSpec`, validated and frozen as a TensorSpec (what
the planner plans and the verifier re-checks a plan's tensors against).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias

from reshard.cluster import Cluster
from reshard.dtypes import Cast, ScaleMode, check_cast, parse_dtype, summable, why_not_summable
from reshard.errors import PartialError, ReshardError, SpecError
from reshard.layout import Layout, check_shape
from reshard.planner.values.tasks import Derive, TensorSpec

Request: TypeAlias = TensorSpec | Sequence[Any]
"""A tensor to plan: a TensorSpec, or ``(shape, dtype, src_layout, dst_layout)``,
optionally with a fifth item, its cast (a :class:`~reshard.dtypes.Cast`, a dtype or
None)."""


def make_tensor_spec(shape: Sequence[int], dtype: object, src: Layout, dst: Layout,
                     cluster: Cluster, cast: Cast | None = None) -> TensorSpec:
    """Validate one request and freeze it as a :class:`TensorSpec` (``cast``: convert
    on the wire, see :mod:`reshard.dtypes`)."""
    shape_t = check_shape(shape)
    dt = parse_dtype(dtype)
    out = dt.name if cast is None else cast.dtype
    for name, lay in (("source", src), ("destination", dst)):
        if not isinstance(lay, Layout):
            raise SpecError(f"{name} layout must be a reshard.Layout, got {type(lay).__name__}")
        try:
            lay.spec.check(lay.mesh.ndim, len(shape_t))
        except SpecError as e:
            raise SpecError(f"{name} layout: {e}") from None
        cluster.check_devices(lay.devices, f"the {name} mesh {lay.mesh}")
        held = dt.name if lay is src else out
        if lay.spec.is_partial and not summable(held):
            raise PartialError(
                f"{name} layout '{lay.spec}' is a partial sum, but {why_not_summable(held)}; "
                f"or use a non-partial layout such as '{str(lay.spec).split('+')[0]}'"
            )
    if cast is None or (cast.dtype == dt.name and cast.scale is ScaleMode.NONE):
        return TensorSpec(shape_t, dt.name, src, dst)
    check_cast(dt.name, cast, shape_t, src.spec.is_partial)
    return TensorSpec(shape_t, dt.name, src, dst, cast=cast.dtype, scale=cast.scale,
                      fold=cast.fold)


def request_parts(request: Request) -> tuple[Any, Any, Any, Any, Cast | None]:
    """``(shape, dtype, src_layout, dst_layout, cast)`` of a request (a TensorSpec or
    such a tuple, the cast optional), unchecked but for the cast; :class:`ReshardError`
    if it is neither."""
    if isinstance(request, TensorSpec):
        if request.derive is not Derive.NONE:
            raise ReshardError(
                f"request {request} is a tensor the planner derives (a scaled cast's "
                f"{request.derive.value}); request the scaled tensor itself")
        cast = (None if not request.cast and request.scale is ScaleMode.NONE
                else Cast(request.out_dtype, request.scale, request.fold))
        return request.shape, request.dtype, request.src, request.dst, cast
    try:
        parts = tuple(request)
    except TypeError:
        parts = ()
    if len(parts) not in (4, 5):
        raise ReshardError(
            f"each request is (shape, dtype, src_layout, dst_layout) or (..., cast), got "
            f"{request!r:.200}")
    cast = Cast.parse(parts[4]) if len(parts) == 5 else None
    return parts[0], parts[1], parts[2], parts[3], cast


def default_cluster(layouts: Iterable[Layout]) -> Cluster:
    """One host holding every device of the layouts (paper link figures)."""
    devs: set[int] = set()
    for lay in layouts:
        devs.update(lay.devices)
    return Cluster((tuple(sorted(devs)),), name="single-host")


__all__ = ["Request", "default_cluster", "make_tensor_spec", "request_parts"]

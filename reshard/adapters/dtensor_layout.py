"""PyTorch DTensor layouts: a ``DeviceMesh`` and its placements <-> a reshard :class:`Layout`.

DTensor applies placements left to right: each mesh dim that shards tensor dim ``d``
chunks the piece the previous ones left (``torch.chunk``'s rule), so several mesh dims
on one uneven tensor dim split it *nested*; layouts made here carry
:attr:`reshard.core.spec.SplitRule.NESTED` and match DTensor's own
``compute_local_shape_and_global_offset`` on every rank.

Device ids are the global ranks of ``device_mesh.mesh`` (row-major), so a layout from
here plans transfers between the ranks of the default process group.

``_StridedShard`` (FSDP2 + TP's right-to-left sharding) is read when it is a reordering
of mesh dims: on one tensor dim, ``Shard`` placements, then one
``_StridedShard(d, split_factor=k)``, then ``Shard`` placements on mesh dims whose sizes
multiply to ``k``; and only with ``shape=`` given, each such dim divisible by the
product of its mesh dims (on uneven sizes DTensor's strided shards are not contiguous,
which no layout of boxes can hold).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh as TorchMesh
from torch.distributed.tensor import Partial as TorchPartial
from torch.distributed.tensor import Placement as TorchPlacement
from torch.distributed.tensor import Replicate as TorchReplicate
from torch.distributed.tensor import Shard as TorchShard
from torch.distributed.tensor.placement_types import _StridedShard

from reshard.core.errors import SpecError
from reshard.core.layout import Layout
from reshard.core.mesh import DeviceMesh
from reshard.core.spec import Partial, Replicate, Shard, ShardingSpec, SplitRule

__all__ = ["from_layout", "mesh_of", "to_layout", "to_placements"]


def mesh_of(device_mesh: TorchMesh) -> DeviceMesh:
    """The reshard mesh of a torch ``DeviceMesh``: its global ranks, row-major, and its
    mesh dim names when it has them."""
    if not isinstance(device_mesh, TorchMesh):
        raise SpecError(
            f"expected a torch.distributed.device_mesh.DeviceMesh, got "
            f"{type(device_mesh).__name__}; build one with init_device_mesh(...)")
    ranks: torch.Tensor = device_mesh.mesh
    return DeviceMesh(tuple(ranks.shape), devices=ranks.flatten().tolist(),
                      axis_names=device_mesh.mesh_dim_names)


def to_layout(device_mesh: TorchMesh, placements: Sequence[TorchPlacement],
              shape: Sequence[int] | int | None = None) -> Layout:
    """The layout of a DTensor with these placements on ``device_mesh``.

    Args:
        device_mesh: the torch ``DeviceMesh`` (its ``mesh`` tensor gives the global ranks).
        placements: one per mesh dim: ``Shard(d)``, ``Replicate()``, ``Partial()``
            (sum only), or ``_StridedShard`` (see the module docstring).
        shape: the global tensor shape (``dtensor.shape``), or just its rank. It fixes
            the layout's rank; without it the rank is one past the highest sharded dim
            (pass it for tensors with unsharded trailing dims). A ``_StridedShard``
            needs the full shape.

    Returns:
        A layout whose ``index_map(shape)`` is, per rank, DTensor's local shard (nested
        split rule).

    Raises:
        SpecError: wrong number of placements, a dim out of range, a non-sum
            ``Partial``, or a ``_StridedShard`` that is not a reordering of mesh dims.
    """
    mesh = mesh_of(device_mesh)
    placements = tuple(placements)
    if len(placements) != mesh.ndim:
        raise SpecError(
            f"a {mesh.ndim}-dim DeviceMesh {mesh.shape} needs {mesh.ndim} placements, got "
            f"{len(placements)}: {placements}; give one per mesh dim")
    if not any(isinstance(p, _StridedShard) for p in placements):
        ndim = _rank(placements, shape)
        ours = [_convert(p, axis) for axis, p in enumerate(placements)]
        return Layout(mesh, ShardingSpec.from_placements(ours, ndim))
    if shape is None or isinstance(shape, int):
        raise SpecError(
            f"placements {placements} contain a _StridedShard, whose shards are contiguous "
            f"boxes only on evenly divisible dims; pass shape= (the global shape) so that "
            f"can be checked")
    return Layout(mesh, _strided_spec(mesh, placements, tuple(shape)))


def to_placements(layout: Layout) -> tuple[TorchPlacement, ...]:
    """DTensor placements for ``layout`` (the inverse of :func:`to_layout`).

    Raises:
        SpecError: if a dim is split minor-axis-first, or by several axes under the
            flat rule (DTensor splits nested; see ``ShardingSpec.to_placements``).
    """
    return tuple(_TO_TORCH[type(p)](p) for p in layout.spec.to_placements(layout.mesh.ndim))


# ----- conversion tables --------------------------------------------------------------
from_layout = to_placements
"""The adapters' one shape: ``to_layout`` (the system's sharding to a reshard
:class:`~reshard.core.layout.Layout`) and ``from_layout`` (back); here :func:`to_placements`."""


def _from_partial(p: TorchPlacement, axis: int) -> Partial:
    op = p.reduce_op  # type: ignore[attr-defined]
    if op != "sum":
        raise SpecError(
            f"Partial(reduce_op={op!r}) on mesh dim {axis}: reshard moves partial sums only; "
            f"use Partial('sum'), or redistribute to Replicate() first")
    return Partial()


_FROM_TORCH: dict[type, Callable[[TorchPlacement, int], Shard | Replicate | Partial]] = {
    TorchShard: lambda p, axis: Shard(int(p.dim)),  # type: ignore[attr-defined]
    TorchReplicate: lambda p, axis: Replicate(),
    TorchPartial: _from_partial,
}

_TO_TORCH: dict[type, Callable[[Shard | Replicate | Partial], TorchPlacement]] = {
    Shard: lambda p: TorchShard(p.dim),  # type: ignore[union-attr]
    Replicate: lambda p: TorchReplicate(),
    Partial: lambda p: TorchPartial("sum"),
}


def _convert(p: TorchPlacement, axis: int) -> Shard | Replicate | Partial:
    for cls in type(p).__mro__:
        if cls in _FROM_TORCH:
            return _FROM_TORCH[cls](p, axis)
    raise SpecError(
        f"unsupported placement {p!r} on mesh dim {axis}; valid: Shard(d), Replicate(), "
        f"Partial('sum'), _StridedShard(d, split_factor=k)")


def _rank(placements: Sequence[TorchPlacement], shape: Sequence[int] | int | None) -> int:
    """The tensor rank: ``shape``'s, else one past the largest sharded dim."""
    if isinstance(shape, int):
        return shape
    if shape is not None:
        return len(shape)
    dims = [int(p.dim) for p in placements if isinstance(p, (TorchShard, _StridedShard))]
    if any(d < 0 for d in dims):
        raise SpecError(
            f"placements {tuple(placements)} shard a negative dim; pass shape= so it can be "
            f"resolved, or use the non-negative dim")
    return 1 + max(dims, default=-1)


def _strided_spec(mesh: DeviceMesh, placements: Sequence[TorchPlacement],
                  shape: tuple[int, ...]) -> ShardingSpec:
    """A nested spec equal to placements that hold ``_StridedShard`` (reorderings)."""
    ndim = len(shape)
    per_dim: dict[int, list[int]] = {}
    partial: list[int] = []
    for axis, p in enumerate(placements):
        if isinstance(p, (TorchShard, _StridedShard)):
            d = int(p.dim) + ndim if int(p.dim) < 0 else int(p.dim)
            if not 0 <= d < ndim:
                raise SpecError(
                    f"{p!r} on mesh dim {axis} names tensor dim {p.dim}, out of range for "
                    f"shape {shape}")
            per_dim.setdefault(d, []).append(axis)
        elif isinstance(_convert(p, axis), Partial):
            partial.append(axis)
    dims: list[tuple[int, ...]] = [() for _ in range(ndim)]
    for d, axes in per_dim.items():
        dims[d] = _strided_order(mesh, placements, axes, d, shape)
    return ShardingSpec(tuple(dims), tuple(partial), SplitRule.NESTED)


def _strided_order(mesh: DeviceMesh, placements: Sequence[TorchPlacement],
                   axes: list[int], d: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    strided = [a for a in axes if isinstance(placements[a], _StridedShard)]
    if not strided:
        return tuple(axes)
    a = strided[0]
    after = [b for b in axes if b > a]
    factor = int(placements[a].split_factor)  # type: ignore[attr-defined]
    after_size = math.prod(mesh.shape[b] for b in after)
    if len(strided) > 1 or factor != after_size:
        raise SpecError(
            f"tensor dim {d} is sharded by {[placements[b] for b in axes]} on mesh dims "
            f"{axes} of mesh {mesh.shape}: reshard reads a _StridedShard only as a "
            f"reordering (one _StridedShard whose split_factor equals the product of the "
            f"sizes of the later mesh dims sharding that tensor dim, here {after_size}); "
            f"redistribute to Shard placements first")
    k = math.prod(mesh.shape[b] for b in axes)
    if shape[d] % k:
        raise SpecError(
            f"tensor dim {d} of shape {shape} should be divisible by {k} (the mesh dims "
            f"{axes} sharding it with a _StridedShard), but it is equal to {shape[d]}; "
            f"DTensor's strided shards of an uneven dim are not contiguous boxes: "
            f"redistribute to Shard placements first")
    before = [b for b in axes if b < a]
    return tuple(before + after + [a])

"""The tensors a scaled cast adds to a plan: its amax and its scales.

A cast to float8 with scales (:class:`reshard.dtypes.ScaleMode`) divides each element
by the scale of its block, ``amax / max_finite`` over the global tensor's block, before
it is packed. Every device that packs a box needs the scales of the blocks the box
meets, and a block may straddle several source shards, so its amax is reduced across
them first, with the partial-sum machinery and another operator (max). A scaled
tensor ``W`` (index ``i``) brings:

* its **amax** ``A`` (``Derive.AMAX``, float32, the shape of the scale grid): on every
  device of ``W``'s source mesh, the max ``|x|`` of each block over the elements it
  holds (zeros elsewhere), a partial max over every mesh axis; its destination is the
  same mesh, replicated (an all-reduce of max). Its tasks form the plan's first phase.
* its **scales** ``S`` (``Derive.SCALES``, float32 or, for the power-of-two modes,
  float8_e8m0fnu): the scales of ``A``'s result, source on the
  same replicated layout, delivered laid out like ``W`` on the destination mesh (a
  per-tensor scale: replicated there). ``W``'s packers read their scales from ``S``'s
  source shard, so ``W`` and ``S`` move in the second phase.

When every source shard of ``W`` holds whole blocks only (``block_aligned``: shard
edges on multiples of 128, or a replicated source for a per-tensor scale), each device
knows the amax of its own blocks: ``S`` is then ``Derive.OWN_SCALES`` of ``W``, laid
out on the grid as ``W`` is on the tensor, and there is no amax phase.
"""

from __future__ import annotations

from dataclasses import replace

from reshard.casting import block_range
from reshard.dtypes import ScaleMode, block_shape, scale_grid
from reshard.layout import Layout
from reshard.planner.values.tasks import Derive, TensorSpec
from reshard.spec import ShardingSpec


def scales_layout(w: TensorSpec) -> Layout:
    """Where ``w``'s scales are delivered: laid out on the grid as ``w`` is on its
    destination mesh when its destination shards hold whole blocks (each device gets
    exactly its blocks' scales, the case inference engines require), else replicated
    there (every device gets every block's, so it can use those its shard meets); a
    per-tensor scale: replicated."""
    spec = w.dst.spec
    like = Layout(w.dst.mesh, ShardingSpec(spec.dims, (), spec.rule))
    if w.scale is not ScaleMode.TENSOR and _holds_whole_blocks(w, w.dst, like):
        return like
    return Layout(w.dst.mesh, ShardingSpec.replicated(len(w.shape)))


def amax_layouts(w: TensorSpec) -> tuple[Layout, Layout]:
    """The amax's source (every device of ``w``'s source mesh holds a partial max of
    the whole grid) and destination (the same mesh, replicated) layouts."""
    mesh = w.src.mesh
    ndim = len(w.shape)
    part = Layout(mesh, ShardingSpec(((),) * ndim, tuple(range(mesh.ndim))))
    return part, Layout(mesh, ShardingSpec.replicated(ndim))


def own_scales_layout(w: TensorSpec) -> Layout:
    """The scales' source layout when ``w``'s shards hold whole blocks: ``w``'s source
    layout (its split, not its partial axes) on the grid."""
    spec = w.src.spec
    return Layout(w.src.mesh, ShardingSpec(spec.dims, (), spec.rule))


def block_aligned(w: TensorSpec) -> bool:
    """True if every device of ``w``'s source holds whole blocks, and the grid laid out
    as ``w`` gives each device exactly the blocks of its shard (see the module
    docstring)."""
    return _holds_whole_blocks(w, w.src, own_scales_layout(w))


def _holds_whole_blocks(w: TensorSpec, layout: Layout, grid_layout: Layout) -> bool:
    """True if each device's shard of ``w`` under ``layout`` holds whole blocks, which
    ``grid_layout`` gives it on the scale grid (and nothing more)."""
    block = block_shape(w.shape, w.scale, w.fold)
    grid = scale_grid(w.shape, w.scale, w.fold)
    grid_boxes = grid_layout.boxes(grid)
    for d, box in layout.boxes(w.shape).items():
        if any(c <= a for a, c in box):
            if any(c > a for a, c in grid_boxes[d]):
                return False
            continue
        if any(a % b or (c % b and c != n) for (a, c), b, n in zip(box, block, w.shape)):
            return False
        if block_range(box, block) != grid_boxes[d]:
            return False
    return True


def scale_tensors(w: TensorSpec, i: int, first: int) -> list[TensorSpec]:
    """The tensors scaled tensor ``w`` (plan tensor ``i``) brings, placed from plan index
    ``first`` on: its amax (unless block-aligned), then its scales."""
    grid = scale_grid(w.shape, w.scale, w.fold)
    kind = w.scale.scale_dtype  # float32, or float8_e8m0fnu for powers of two
    if block_aligned(w):
        return [TensorSpec(grid, kind, own_scales_layout(w), scales_layout(w),
                           derive=Derive.OWN_SCALES, link=i)]
    part, rep = amax_layouts(w)
    return [TensorSpec(grid, "float32", part, rep, derive=Derive.AMAX, link=i),
            TensorSpec(grid, kind, rep, scales_layout(w), derive=Derive.SCALES,
                       link=first)]


def with_scales(tensors: list[TensorSpec]) -> list[TensorSpec]:
    """``tensors`` with every scaled cast's amax (unless block-aligned) and scales
    appended, in the order of the tensors they serve, and each scaled tensor's ``link``
    pointing at its scales."""
    out = list(tensors)
    for i, w in enumerate(tensors):
        if w.scale is not ScaleMode.NONE:
            out += scale_tensors(w, i, len(out))
            out[i] = replace(w, link=len(out) - 1)
    return out


def expected_scales(tensors: tuple[TensorSpec, ...], i: int) -> list[TensorSpec]:
    """What :func:`with_scales` makes for scaled tensor ``i`` (its amax, if any, then its
    scales, the last at its ``link``): the verifier's reference."""
    w = tensors[i]
    return scale_tensors(w, i, w.link - 1)


__all__ = ["amax_layouts", "block_aligned", "expected_scales", "own_scales_layout",
           "scale_tensors", "scales_layout", "with_scales"]

"""Sources a plan derives on each device: a scaled cast's amax and scales.

A cast to float8 with scales (:mod:`reshard.planner.values.scales`) adds tensors whose source
shards no caller gives: an amax (the max ``|x|`` per block of the scaled tensor's source
shard here, a partial max the plan reduces first), and scales (of the amax this device
received, or of its own blocks where its shards hold whole blocks), in the scales'
dtype as the backend holds it (float32, or E8M0 for the power-of-two modes; their
float32 values are kept for packing, :meth:`Execution.scale_values`). The kernels are
:mod:`reshard.core.casting`'s; :data:`DERIVE` maps each kind of derived tensor to its
function, which :meth:`reshard.comm.engine.execution.Execution.source` calls on first read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

from reshard.comm.engine.steps import LoadedProgram
from reshard.comm.program import ProgramTensor
from reshard.core.casting import block_amax, scales_from_amax, stored_scales
from reshard.core.dtypes import block_shape, parse_dtype, scale_grid
from reshard.core.errors import ReshardError
from reshard.planner.values.tasks import Derive


class ExecutionView(Protocol):
    """What deriving a source reads of one execution on one device
    (:class:`reshard.comm.engine.execution.Execution` is the one): a protocol, so that no
    import runs from here back to the execution, not even for types."""

    device: int
    lp: LoadedProgram
    dst: dict[int, Any]
    scale_values_of: dict[int, Any]

    @property
    def tensors(self) -> Sequence[ProgramTensor]:
        """Every planned tensor, in plan order."""
        ...

    def source(self, i: int) -> Any:
        """Tensor ``i``'s source shard here (derived on first read)."""
        ...

    def held_dtype(self, i: int) -> str:
        """The dtype tensor ``i``'s destination holds here before any cast."""
        ...


def block_amax_here(ex: ExecutionView, w: int) -> Any:
    """The max ``|x|`` per block of scaled tensor ``w``'s source shard here, over its
    whole scale grid (zeros for blocks the shard does not meet)."""
    pt = ex.tensors[w]
    block = block_shape(pt.shape, pt.scale, pt.fold)
    return block_amax(ex.source(w), ex.lp.src_box[w], block,
                      scale_grid(pt.shape, pt.scale, pt.fold), ex.held_dtype(w))


def amax(ex: ExecutionView, i: int) -> Any:
    """Tensor ``i`` (an amax): the scaled tensor's block amax here (a partial max)."""
    return block_amax_here(ex, ex.tensors[i].link)


def scales(ex: ExecutionView, i: int) -> Any:
    """Tensor ``i`` (scales): of the amax this device received (tensor ``link``'s
    destination shard, complete since the plan's first phase)."""
    a = ex.tensors[i].link
    return stored(ex, i, ex.tensors[a].link, ex.dst[a])


def own_scales(ex: ExecutionView, i: int) -> Any:
    """Tensor ``i`` (scales of block-aligned shards): of the blocks of the scaled
    tensor's own source shard here."""
    w = ex.tensors[i].link
    blocks = block_amax_here(ex, w)
    return stored(ex, i, w, blocks[tuple(slice(a, b) for a, b in ex.lp.src_box[i])])


def stored(ex: ExecutionView, i: int, w: int, block_max: Any) -> Any:
    """Scales tensor ``i``'s source shard, of scaled tensor ``w``'s blocks whose max
    ``|x|`` is ``block_max``, as the backend holds the scales' dtype; their float32
    values are kept in ``ex.scale_values_of``."""
    pt = ex.tensors[w]
    values = scales_from_amax(block_max, pt.out_dtype, pt.scale)
    ex.scale_values_of[i] = values
    kind = pt.scale.scale_dtype
    if kind == "float32":
        return values
    like = ex.lp.backend.empty(math.prod(values.shape), parse_dtype(kind))
    return stored_scales(values, pt.scale, like.reshape(tuple(values.shape)))


def given(ex: ExecutionView, i: int) -> Any:
    """A tensor the caller gives: reaching here, it was not given."""
    raise ReshardError(f"device {ex.device} was given no source shard of tensor {i}")


DERIVE: Mapping[Derive, Callable[[ExecutionView, int], Any]] = MappingProxyType({
    Derive.NONE: given,
    Derive.AMAX: amax,
    Derive.SCALES: scales,
    Derive.OWN_SCALES: own_scales,
})
"""How each kind of source is computed when first read (:meth:`Execution.source`)."""

__all__ = ["DERIVE", "amax", "block_amax_here", "given", "own_scales", "scales", "stored"]

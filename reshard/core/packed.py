"""Packed parameters: fused buffers as views of their logical parts.

Inference engines fuse a layer's q, k and v projections into one ``qkv_proj`` and its
gate and up projections into one ``gate_up_proj``: on each tensor-parallel rank the
buffer holds that rank's q rows, then its k rows, then its v rows (vLLM's
``QKVParallelLinear``, ``MergedColumnParallelLinear``). With grouped-query attention
and more ranks than kv heads, each kv head is replicated on ``tp / kv_heads`` ranks.
Megatron-LM's ``linear_qkv`` instead interleaves per query group: a rank's shard is, for
each of its groups, the group's q heads, then its k head, then its v head.

reshard moves the logical parts, each a tensor with its own layout on each side, in
one plan; a rank passes views of its fused buffers as the parts' shards (sources, and
``out=`` on the receiving side), so the bytes land in the engine's packed buffer with
no full-size temporary anywhere. Attention's parts are kept in *grouped* coordinates,
``q: (groups, q_per_group * head_dim, hidden)``, ``k, v: (groups, head_dim, hidden)``, so
that both packings are plain views (Megatron's strided, vLLM's contiguous) and a rank's
part is a box of the logical tensor:

* :class:`Packing`: one rank's fused buffer as its parts (rows per part, repeated per
  group); :meth:`Packing.views` gives each part's view with the shard's shape.
* :class:`Attention`: the grouped parts' shapes, their tensor-parallel layouts
  (:meth:`Attention.layouts`, with kv replication when ``tp > kv_heads``) and the two
  packings (:meth:`Attention.engine_packing`: vLLM's; :meth:`Attention.megatron_packing`).
* :func:`mlp_parts`: gate and up, concatenated per rank (both sides).

**fp8 scales as engines lay them out.** An engine quantizes each projection as a 2-D
weight ``[out, hidden]`` in 128 x 128 blocks; with ``head_dim`` 64 one block spans two
kv heads' rows, which in grouped coordinates are two groups. :meth:`Attention.casts`
gives each part the cast whose blocks are the 2-D projection's (``fold``,
:func:`reshard.core.dtypes.projection_block`), so the delivered scales are, byte for byte,
those of the 2-D quantization. :meth:`Packing.scales` lays the parts' scales out as the
engine packs its fused scale buffer (``weight_scale_inv``): per part, its rows' blocks,
in the weight's part order; a part whose rows on a rank are not whole 128-row blocks is
refused, naming it, as the engines refuse it:

* vLLM (``vllm/model_executor/layers/quantization/utils/fp8_utils.py``,
  ``create_fp8_scale_parameter``: a fused layer's ``weight_scale_inv`` is
  ``[ceil(rows / 128), ceil(hidden / 128)]`` of the rank's fused rows;
  ``validate_fp8_block_shape``: every part's rows on a rank a multiple of 128, but the
  last one at TP 1) and ``vllm/model_executor/layers/linear.py``
  (``QKVParallelLinear.weight_loader_v2`` with ``adjust_block_scale_shard``: part ``p``
  lands at row ``offset_p / 128``, from the checkpoint's 2-D scales of its rows; kv
  parts of rank ``r`` from kv head ``r // replicas``).
* SGLang (``python/sglang/srt/layers/linear.py``, ``QKVParallelLinear.weight_loader_v2``:
  the same offsets, ``block_n`` inlined; ``srt/layers/quantization/fp8_utils.py``,
  ``validate_fp8_block_shape``: the same rule).
* Megatron-Core's ``linear_qkv`` with Transformer Engine's blockwise fp8
  (``Float8BlockQuantizer``: 128 x 128 blocks of the rank's fused weight, its
  ``rowwise_scale_inv`` ``[ceil(rows / 128), ceil(hidden / 128)]`` padded to a multiple
  of 4 columns): a block lies within one part only when every part's rows per group are
  whole blocks (``head_dim`` 128 and up), and the scales interleave per group as the
  weight does.

``mx32`` scales one row's 32 elements, so a part's scales are its rows' and pack as
its rows do (no fold, nothing refused).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reshard.core.dtypes import BLOCK, Cast, ScaleMode, projection_block
from reshard.core.errors import DTypeError, ReshardError
from reshard.core.layout import Layout
from reshard.core.mesh import DeviceMesh


@dataclass(frozen=True)
class Packing:
    """One rank's fused buffer: along its dim 0, ``groups`` repetitions of its parts'
    rows in order (``groups`` 1: the parts concatenated).

    Attributes:
        rows: ``(part name, rows per group)`` in buffer order.
        groups: repetitions (Megatron's query groups on the rank; 1 for vLLM's buffers).
    """

    rows: tuple[tuple[str, int], ...]
    groups: int = 1

    @property
    def length(self) -> int:
        """The buffer's extent along dim 0."""
        return self.groups * sum(n for _, n in self.rows)

    def shape(self, rest: Sequence[int]) -> tuple[int, ...]:
        """The fused buffer's shape, ``rest`` its other dims."""
        return (self.length, *rest)

    def views(self, buffer: Any, shards: Mapping[str, Sequence[int] | None]) -> dict[str, Any]:
        """Each part's view of ``buffer`` (numpy or torch; never a copy), shaped as its
        shard in ``shards`` (None: the rank holds none of that part: no view).

        Raises:
            ReshardError: the buffer's dim 0 is not :attr:`length`, or a part's rows
                do not hold its shard (naming the part and both sizes).
        """
        if len(buffer.shape) < 1 or buffer.shape[0] != self.length:
            raise ReshardError(
                f"packed buffer of shape {tuple(buffer.shape)}: its parts "
                f"{[n for n, _ in self.rows]} take {self.groups} x "
                f"{sum(n for _, n in self.rows)} = {self.length} rows of dim 0")
        rest = tuple(buffer.shape[1:])
        per_group = buffer.reshape(self.groups, self.length // self.groups, *rest)
        out: dict[str, Any] = {}
        at = 0
        for name, n in self.rows:
            shard = shards.get(name)
            part = per_group[:, at:at + n]
            at += n
            if shard is None:
                continue
            if math.prod(shard) != math.prod(part.shape):
                raise ReshardError(
                    f"part {name!r}: its shard {tuple(shard)} has {math.prod(shard)} "
                    f"elements, its rows of the packed buffer {math.prod(part.shape)} "
                    f"({self.groups} x {n} rows x {rest}); the parts do not add up to "
                    f"the buffer")
            out[name] = part.reshape(tuple(shard)) if tuple(part.shape) != tuple(shard) \
                else part
        missing = sorted(set(shards) - {n for n, _ in self.rows})
        if missing:
            raise ReshardError(f"parts {missing} are not in the packing "
                               f"{[n for n, _ in self.rows]}")
        return out

    def scales(self, scale: ScaleMode | str) -> Packing:
        """The packing of this buffer's scales as the engine lays them out (the module
        docstring cites each engine): the 128 x 128 modes one row per 128 rows of a
        part (its blocks' row), ``mx32`` one per row; in the weight's part order,
        repeated per group as the weight is. The scale buffer's shape is
        ``reshard.core.dtypes.scale_grid(weight buffer shape, scale)``.

        Raises:
            ReshardError: a 128 x 128 mode and a part's rows (per group) not a multiple
                of 128: the engine's blocks would span two parts (naming the part,
                its rows and the rule); a mode with no per-row blocks.
        """
        mode = ScaleMode.parse(scale)
        if mode is ScaleMode.MX32:
            return self
        if mode not in (ScaleMode.BLOCK128, ScaleMode.BLOCK128_UE8M0):
            raise ReshardError(
                f"scale {mode.value!r} has no per-row blocks to pack; valid: 'block128', "
                f"'block128-ue8m0', 'mx32'")
        for name, n in self.rows:
            if n % BLOCK:
                per = f" per group ({self.groups} groups)" if self.groups > 1 else ""
                raise ReshardError(
                    f"part {name!r} has {n} rows{per} on each rank, not a multiple of "
                    f"{BLOCK}: the engine's fused scale buffer blocks {BLOCK} rows of the "
                    f"fused weight, so a block would span two parts (vLLM's and SGLang's "
                    f"validate_fp8_block_shape refuse it too); use a tensor parallelism "
                    f"that leaves each part whole blocks, or mx32 scales")
        return Packing(tuple((name, n // BLOCK) for name, n in self.rows), self.groups)


@dataclass(frozen=True)
class Attention:
    """Grouped-query attention's q, k, v projections (weights ``[out, hidden]``).

    Attributes:
        heads: query heads.
        kv_heads: key / value heads (the query groups).
        head_dim: each head's width.
        hidden: the model width (the weights' input dim).
    """

    heads: int
    kv_heads: int
    head_dim: int
    hidden: int

    def __post_init__(self) -> None:
        if min(self.heads, self.kv_heads, self.head_dim, self.hidden) < 1 or \
                self.heads % self.kv_heads:
            raise ReshardError(
                f"attention with {self.heads} heads and {self.kv_heads} kv heads: the "
                f"heads must be a positive multiple of the kv heads")

    @property
    def per_group(self) -> int:
        """Query heads per kv head."""
        return self.heads // self.kv_heads

    def shapes(self) -> dict[str, tuple[int, int, int]]:
        """The parts' global shapes, grouped: ``q (groups, per_group * head_dim,
        hidden)``, ``k`` and ``v`` ``(groups, head_dim, hidden)``."""
        g, d, h = self.kv_heads, self.head_dim, self.hidden
        return {"q": (g, self.per_group * d, h), "k": (g, d, h), "v": (g, d, h)}

    def _check_tp(self, tp: int) -> int:
        """Ranks sharing one kv head (1 when ``tp <= kv_heads``)."""
        g = self.kv_heads
        if tp >= 1 and g % tp == 0:
            return 1
        if tp > g and tp % g == 0 and self.per_group % (tp // g) == 0:
            return tp // g
        valid = sorted({t for t in range(1, self.heads + 1)
                        if g % t == 0 or (t % g == 0 and self.per_group % (t // g) == 0)})
        raise ReshardError(
            f"tensor parallelism {tp} with {self.kv_heads} kv heads and {self.heads} "
            f"heads: tp must divide the kv heads, or be a multiple of them that divides "
            f"the heads (each kv head then on tp / kv_heads ranks); valid: {valid}")

    def layouts(self, devices: Sequence[int], replicas: int = 1) -> dict[str, Layout]:
        """The parts' layouts on tensor-parallel groups (``replicas`` of them, the
        devices replica-major: rank ``r`` of replica ``i`` is ``devices[i * tp + r]``),
        as vLLM shards them: each rank the q heads ``[r H / tp, (r + 1) H / tp)`` and the
        kv heads of its groups; with ``tp > kv_heads`` rank ``r`` holds kv head
        ``r // (tp / kv_heads)``, replicated on those ranks, and its slice of that
        group's q heads. Megatron's TP shards alike (it needs ``tp <= kv_heads``).

        Raises:
            ReshardError: ``tp`` neither divides the kv heads nor is a multiple of them
                dividing the heads (the valid ``tp`` named), or ``replicas`` does not
                divide the devices.
        """
        if replicas < 1 or len(devices) % replicas:
            raise ReshardError(f"{len(devices)} devices do not make {replicas} replicas")
        tp = len(devices) // replicas
        rep = self._check_tp(tp)
        lead = () if replicas == 1 else (replicas,)
        axis = len(lead)  # the mesh axis of the kv groups
        if rep == 1:
            mesh = DeviceMesh((*lead, tp), list(devices))
            spec = f"S{axis}RR"
            return {"q": Layout(mesh, spec), "k": Layout(mesh, spec), "v": Layout(mesh, spec)}
        mesh = DeviceMesh((*lead, self.kv_heads, rep), list(devices))
        return {"q": Layout(mesh, f"S{axis}S{axis + 1}R"), "k": Layout(mesh, f"S{axis}RR"),
                "v": Layout(mesh, f"S{axis}RR")}

    def casts(self, cast: Cast) -> dict[str, Cast]:
        """Each part's cast, its scales blocked as an engine blocks the 2-D projection
        (``[out, hidden]``): the 128 x 128 modes with ``fold`` (a block may span several
        groups), the others as they are.

        Raises:
            ReshardError: a part whose 128 rows of the projection are no box of its
                grouped shape (its rows per group neither divide nor are divided by
                128), naming the part.
        """
        if cast.scale not in (ScaleMode.BLOCK128, ScaleMode.BLOCK128_UE8M0):
            return dict.fromkeys(self.shapes(), cast)
        out = {}
        for name, shape in self.shapes().items():
            try:
                projection_block(shape)
            except DTypeError as e:
                raise ReshardError(f"part {name!r} of {self}: {e}") from None
            out[name] = Cast(cast.dtype, cast.scale, fold=True)
        return out

    def engine_packing(self, tp: int) -> Packing:
        """vLLM's (and SGLang's) ``qkv_proj`` on one of ``tp`` ranks: its q rows, its k
        rows, its v rows, concatenated (``.scales(mode)``: its ``weight_scale_inv``)."""
        rep = self._check_tp(tp)
        d = self.head_dim
        kv = (self.kv_heads // tp if rep == 1 else 1) * d
        return Packing((("q", self.heads // tp * d), ("k", kv), ("v", kv)))

    def megatron_packing(self, tp: int) -> Packing:
        """Megatron-LM's ``linear_qkv`` on one of ``tp`` ranks: per query group it holds,
        the group's q heads, its k head, its v head (``.scales(mode)``: Transformer
        Engine's blockwise scales of it, their columns unpadded).

        Raises:
            ReshardError: ``tp`` does not divide the kv heads (Megatron's own rule).
        """
        if tp < 1 or self.kv_heads % tp:
            raise ReshardError(
                f"Megatron's linear_qkv splits whole query groups: tp {tp} must divide "
                f"the {self.kv_heads} kv heads")
        d = self.head_dim
        return Packing((("q", self.per_group * d), ("k", d), ("v", d)),
                       groups=self.kv_heads // tp)


def mlp_parts(intermediate: int, hidden: int, devices: Sequence[int]
              ) -> tuple[dict[str, tuple[int, int]], dict[str, Layout], Packing]:
    """Gate and up projections (``[intermediate, hidden]`` each) on one tensor-parallel
    group: their shapes, layouts (rows split over the group) and the per-rank packing
    (``gate_up_proj``: the rank's gate rows, then its up rows; Megatron's swiglu
    ``linear_fc1`` packs a rank's shard alike)."""
    tp = len(devices)
    if tp < 1 or intermediate % tp:
        raise ReshardError(f"tensor parallelism {tp} must divide the MLP width {intermediate}")
    mesh = DeviceMesh((tp,), list(devices))
    shape = (intermediate, hidden)
    return ({"gate": shape, "up": shape},
            {"gate": Layout(mesh, "S0R"), "up": Layout(mesh, "S0R")},
            Packing((("gate", intermediate // tp), ("up", intermediate // tp))))


def shard_shapes(shapes: Mapping[str, Sequence[int]], layouts: Mapping[str, Layout],
                 device: int) -> dict[str, tuple[int, ...] | None]:
    """Each part's shard shape on ``device`` (None where it holds none): what
    :meth:`Packing.views` takes."""
    out: dict[str, tuple[int, ...] | None] = {}
    for name, shape in shapes.items():
        box = layouts[name].boxes(tuple(shape)).get(device)
        out[name] = None if box is None else tuple(b - a for a, b in box)
    return out


__all__ = ["Attention", "Packing", "mlp_parts", "shard_shapes"]

"""Alpa layouts: Alpa's (``jax.interpreters.pxla``) ``ShardingSpec`` read from plain
Python values, without importing Alpa or JAX.

Semantics (pxla's documented ``ShardingSpec``):

- ``sharding``: per tensor dim, ``NoSharding()`` or ``Chunked(chunks)``. The chunk
  factors of all chunked dims, flattened in dim order, are the *sharded axes*
  ``0, 1, ...``; a dim with ``Chunked([c0, c1])`` is cut into ``c0 * c1`` even chunks,
  the first factor major (chunk ``i0 * c1 + i1``).
- ``mesh_mapping``: per mesh dim, ``ShardedAxis(k)`` (the mesh dim walks sharded axis
  ``k``; its size is that axis's chunk count) or ``Replicated(r)`` (``r`` replicas).
  The mesh's shape is these sizes; devices are laid out row-major over it.

So ``Chunked`` dims become reshard spec tokens whose axes are the mesh dims carrying
their sharded axes in chunk order (flat rule, as XLA tiles): ``[Chunked([2, 2])]`` with
``[ShardedAxis(1), ShardedAxis(0)]`` is ``"S10"``. Alpa requires even chunks;
``Unstacked`` (pmap's) removes a dim and has no layout here.

Values may be this module's dataclasses, Alpa/JAX's own objects (read by class name),
or JSON-like plain values: ``None`` / ``{"NoSharding": None}``, a list of chunk counts
/ ``{"Chunked": [2, 2]}``, ``{"ShardedAxis": k}``, ``{"Replicated": r}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from reshard.core.errors import SpecError
from reshard.core.layout import Layout
from reshard.core.mesh import DeviceMesh
from reshard.core.spec import ShardingSpec, SplitRule

__all__ = ["AlpaShardingSpec", "Chunked", "NoSharding", "Replicated", "ShardedAxis",
           "from_layout", "read_spec", "to_layout"]


@dataclass(frozen=True)
class NoSharding:
    """A tensor dim that is not split."""


@dataclass(frozen=True)
class Chunked:
    """A tensor dim cut into ``prod(chunks)`` even chunks, one sharded axis per factor
    (first factor major)."""

    chunks: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunks", tuple(int(c) for c in self.chunks))


@dataclass(frozen=True)
class ShardedAxis:
    """A mesh dim that walks sharded axis ``axis``."""

    axis: int


@dataclass(frozen=True)
class Replicated:
    """A mesh dim of ``replicas`` devices holding the same data."""

    replicas: int


@dataclass(frozen=True)
class AlpaShardingSpec:
    """Alpa's ShardingSpec: per-dim shardings and per-mesh-dim mappings."""

    sharding: tuple[NoSharding | Chunked, ...]
    mesh_mapping: tuple[ShardedAxis | Replicated, ...]

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The mesh's shape implied by the mapping (chunk counts and replica counts)."""
        chunks = [c for s in self.sharding if isinstance(s, Chunked) for c in s.chunks]
        return tuple(chunks[m.axis] if isinstance(m, ShardedAxis) else m.replicas
                     for m in self.mesh_mapping)


# ----- reading foreign values (at the edge, once) ---------------------------------------
def _plain(value: Any) -> tuple[str, Any]:
    """``(class name, payload)`` of an entry in any accepted form."""
    if value is None:
        return "NoSharding", None
    if isinstance(value, dict) and len(value) == 1:
        ((name, payload),) = value.items()
        return str(name), payload
    if isinstance(value, (list, tuple)):
        return "Chunked", value
    name = type(value).__name__
    return name, _PAYLOAD.get(name, lambda v: v)(value)


_PAYLOAD: dict[str, Callable[[Any], Any]] = {
    "NoSharding": lambda v: None,
    "Chunked": lambda v: v.chunks,
    "Unstacked": lambda v: v.size,
    "ShardedAxis": lambda v: v.axis,
    "Replicated": lambda v: v.replicas,
}


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{what} must be an integer >= 1, got {value!r}")
    return value


def _unstacked(size: Any) -> NoSharding | Chunked:
    raise SpecError(
        f"Unstacked({size}) (pmap's mapped dim) removes the dim from each shard; a "
        f"reshard layout keeps every dim: use Chunked([{size}]) for the same data")


_DIM_READERS: dict[str, Callable[[Any], NoSharding | Chunked]] = {
    "NoSharding": lambda p: NoSharding(),
    "Chunked": lambda p: Chunked(tuple(_count(c, "a chunk count") for c in p)),
    "Unstacked": _unstacked,
}

_MESH_READERS: dict[str, Callable[[Any], ShardedAxis | Replicated]] = {
    "ShardedAxis": lambda p: ShardedAxis(int(p)),
    "Replicated": lambda p: Replicated(_count(p, "a replica count")),
}


def _read(value: Any, table: dict[str, Callable[[Any], Any]], where: str) -> Any:
    name, payload = _plain(value)
    reader = table.get(name)
    if reader is None:
        raise SpecError(
            f"unknown {where} entry {value!r}; valid: {list(table)} (objects of those "
            f"names, or {{name: value}} dicts)")
    return reader(payload)


def read_spec(sharding: Sequence[Any], mesh_mapping: Sequence[Any]) -> AlpaShardingSpec:
    """An :class:`AlpaShardingSpec` from values in any accepted form, checked: every
    sharded axis is carried by exactly one mesh dim."""
    spec = AlpaShardingSpec(
        tuple(_read(s, _DIM_READERS, "sharding") for s in sharding),
        tuple(_read(m, _MESH_READERS, "mesh_mapping") for m in mesh_mapping))
    n_axes = sum(len(s.chunks) for s in spec.sharding if isinstance(s, Chunked))
    carried = sorted(m.axis for m in spec.mesh_mapping if isinstance(m, ShardedAxis))
    if carried != list(range(n_axes)):
        raise SpecError(
            f"mesh_mapping {list(spec.mesh_mapping)} carries sharded axes {carried}, but "
            f"sharding {list(spec.sharding)} has sharded axes {list(range(n_axes))}; "
            f"each must be carried by exactly one mesh dim (ShardedAxis(k))")
    return spec


# ----- conversions ----------------------------------------------------------------------
def to_layout(sharding: Sequence[Any], mesh_mapping: Sequence[Any],
              devices: Sequence[int] | None = None) -> Layout:
    """The layout of Alpa's ``ShardingSpec(sharding, mesh_mapping)``.

    Args:
        sharding: per tensor dim, ``NoSharding`` / ``Chunked`` (any accepted form).
        mesh_mapping: per mesh dim, ``ShardedAxis`` / ``Replicated``.
        devices: device ids row-major over the mesh (Alpa's ``device_ids``); default
            ``0 .. n-1``.

    Raises:
        SpecError: malformed entries, or sharded axes not carried exactly once.
    """
    spec = read_spec(sharding, mesh_mapping)
    carrier = {m.axis: dim for dim, m in enumerate(spec.mesh_mapping)
               if isinstance(m, ShardedAxis)}
    dims: list[tuple[int, ...]] = []
    k = 0
    for s in spec.sharding:
        n = len(s.chunks) if isinstance(s, Chunked) else 0
        dims.append(tuple(carrier[a] for a in range(k, k + n)))
        k += n
    shape = spec.mesh_shape or (1,)
    ids = list(range(math.prod(shape))) if devices is None else [int(d) for d in devices]
    return Layout(DeviceMesh(shape, devices=ids),
                  ShardingSpec(tuple(dims), (), SplitRule.FLAT))


def from_layout(layout: Layout) -> AlpaShardingSpec:
    """Alpa's ShardingSpec of ``layout`` (the inverse of :func:`to_layout`, devices
    aside).

    Raises:
        SpecError: for a partial-sum layout (Alpa's ShardingSpec has no partial sums).
    """
    if layout.spec.partial:
        raise SpecError(
            f"layout {layout} is a partial sum over mesh axes {layout.spec.partial}; "
            f"Alpa's ShardingSpec cannot say that: reduce it first (e.g. reshard to "
            f"'{str(layout.spec).split('+')[0]}')")
    mapping: list[ShardedAxis | Replicated] = [Replicated(n) for n in layout.mesh.shape]
    sharding: list[NoSharding | Chunked] = []
    k = 0
    for axes in layout.spec.dims:
        sharding.append(Chunked(tuple(layout.mesh.shape[a] for a in axes)) if axes
                        else NoSharding())
        for a in axes:
            mapping[a] = ShardedAxis(k)
            k += 1
    return AlpaShardingSpec(tuple(sharding), tuple(mapping))

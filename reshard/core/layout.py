"""Layout: a sharding spec placed on a device mesh, and the boxes each device holds."""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from reshard.core.errors import ShapeError, SpecError
from reshard.core.mesh import DeviceMesh
from reshard.core.spec import ShardingSpec, SplitRule

Box = tuple[tuple[int, int], ...]
"""A global box: per dim a half-open ``(start, stop)`` interval."""


def chunk_size(n: int, k: int) -> int:
    """Elements of each full chunk when a dim of size ``n`` is split ``k`` ways:
    ``ceil(n / k)`` (0 for ``k`` 0; :func:`chunk_bounds`)."""
    return -(-n // k) if k else 0


def chunk_bounds(n: int, k: int, i: int) -> tuple[int, int]:
    """Bounds of chunk ``i`` when a dim of size ``n`` is split ``k`` ways.

    The torch.chunk / DTensor rule: chunks of ``ceil(n / k)`` elements, trailing
    chunks smaller or empty.
    """
    c = chunk_size(n, k)
    return min(i * c, n), min((i + 1) * c, n)


MAX_ELEMENTS = 1 << 56
"""Elements a tensor may have (its byte offsets, at 16 bytes an element, fit int64)."""


def check_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """Validate a tensor shape: a sequence of non-negative integers, at most
    :data:`MAX_ELEMENTS` elements (and every dim at most that)."""
    try:
        out = tuple(int(s.__index__()) for s in shape)
    except (AttributeError, TypeError):
        raise ShapeError(
            f"tensor shape must be a sequence of integers, got {shape!r}; e.g. (1024, 64)"
        ) from None
    if any(s < 0 for s in out):
        raise ShapeError(
            f"tensor dims must be >= 0, got shape {out}; use 0 for an empty dim"
        )
    big = max(out, default=0)
    if big > MAX_ELEMENTS or math.prod(min(s, MAX_ELEMENTS + 1) for s in out) > MAX_ELEMENTS:
        dims = ", ".join(str(s) if s < 1 << 64 else f"~2**{s.bit_length() - 1}" for s in out)
        raise ShapeError(
            f"a tensor may have at most 2**56 elements (and no dim larger), got shape "
            f"({dims}); describe a smaller tensor")
    return out


def box_to_slices(box: Box) -> tuple[slice, ...]:
    """``((a, b), ...)`` -> ``(slice(a, b), ...)``."""
    return tuple(slice(a, b) for a, b in box)


def box_size(box: Box) -> int:
    """Number of elements in a box."""
    n = 1
    for a, b in box:  # a loop, not math.prod of a generator: twice as fast, and hot
        n *= b - a
    return n


def box_within(inner: Box, outer: Box) -> bool:
    """True if every element of ``inner`` lies in ``outer`` (same rank)."""
    for (a, b), (c, e) in zip(inner, outer):  # noqa: SIM110 - a loop: twice as fast as all()
        if a < c or e < b:
            return False
    return True


def boxes_meet(a: Box, b: Box) -> bool:
    """True if two boxes of one rank share an element (0-d boxes always do)."""
    for (p, q), (r, s) in zip(a, b):  # noqa: SIM110 - a loop: faster than all()
        if p >= q or r >= s or p >= s or r >= q:  # max(p, r) >= min(q, s)
            return False
    return True


def flat_bounds(n: int, parts: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The flat rule: one chunking of ``n`` by the product of the axes' sizes.

    Args:
        n: size of the dim.
        parts: per splitting mesh axis, major first, ``(axis size, coordinate)``.
    """
    idx, k = 0, 1
    for size, coord in parts:
        idx = idx * size + coord
        k *= size
    return chunk_bounds(n, k, idx)


def nested_bounds(n: int, parts: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The nested rule: the first axis chunks ``n``, each next axis chunks the piece
    the previous one left (DTensor's ``Shard`` placements applied left to right).

    Args:
        n: size of the dim.
        parts: per splitting mesh axis, in splitting order, ``(axis size, coordinate)``.
    """
    lo, hi = 0, n
    for size, coord in parts:
        a, b = chunk_bounds(hi - lo, size, coord)
        lo, hi = lo + a, lo + b
    return lo, hi


_SPLITTERS = {SplitRule.FLAT: flat_bounds, SplitRule.NESTED: nested_bounds}


def _bounds_column(split: Callable[[int, Sequence[tuple[int, int]]], tuple[int, int]],
                   n: int, sizes: list[int], axes: Sequence[int],
                   coords: list[tuple[int, ...]]) -> list[tuple[int, int]]:
    """One tensor dim's bounds on every device (``coords``: theirs on the mesh), each
    distinct combination of the splitting ``axes``' coordinates split once."""
    if not axes:
        return [split(n, ())] * len(coords)
    known = {key: split(n, tuple(zip(sizes, key)))
             for key in itertools.product(*map(range, sizes))}
    if len(axes) == 1:
        (a,) = axes
        by_coord = [known[(c,)] for c in range(sizes[0])]
        return [by_coord[c[a]] for c in coords]
    pick = operator.itemgetter(*axes)
    return [known[pick(c)] for c in coords]


@dataclass(frozen=True, init=False)
class Layout:
    """A tensor layout: ``spec`` applied on ``mesh``.

    Args:
        mesh: the device mesh.
        spec: a :class:`ShardingSpec` or its text form.
    """

    mesh: DeviceMesh
    spec: ShardingSpec

    def __init__(self, mesh: DeviceMesh, spec: ShardingSpec | str) -> None:
        if not isinstance(mesh, DeviceMesh):
            raise SpecError(f"Layout needs a DeviceMesh, got {type(mesh).__name__}")
        spec = ShardingSpec.parse(spec)
        spec.check(mesh.ndim)
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "spec", spec)

    @property
    def devices(self) -> tuple[int, ...]:
        """Devices of the mesh."""
        return self.mesh.devices

    def num_chunks(self, dim: int) -> int:
        """How many ways tensor dim ``dim`` is split (under either rule)."""
        return math.prod(self.mesh.shape[a] for a in self.spec.dims[dim])

    def boxes(self, shape: Sequence[int]) -> dict[int, Box]:
        """The global box each device holds, as ``{device: ((start, stop), ...)}``,
        by the spec's split rule (:class:`reshard.core.spec.SplitRule`)."""
        shape = check_shape(shape)
        self.spec.check(self.mesh.ndim, len(shape))
        split = _SPLITTERS[self.spec.rule]
        extents = self.mesh.shape
        coords = list(itertools.product(*map(range, extents)))  # row-major: iter_coords'
        columns = [_bounds_column(split, n, [extents[a] for a in axes], axes, coords)
                   for n, axes in zip(shape, self.spec.dims)]
        if not columns:
            return {dev: () for dev in self.mesh.devices}
        return dict(zip(self.mesh.devices, zip(*columns)))

    def index_map(self, shape: Sequence[int]) -> dict[int, tuple[slice, ...]]:
        """The global slice each device holds; replicas (and partial addends) hold equal
        slices."""
        return {d: box_to_slices(b) for d, b in self.boxes(shape).items()}

    def shard_shape(self, shape: Sequence[int], device: int) -> tuple[int, ...]:
        """Local shape of ``device``'s shard."""
        return tuple(b - a for a, b in self.boxes(shape)[device])

    def partial_groups(self) -> list[tuple[int, ...]]:
        """Groups of devices whose shards sum to the value (one group per combination of
        coordinates on the non-partial axes). Without partial axes, every device is its
        own group."""
        groups: dict[tuple[int, ...], list[int]] = {}
        part = set(self.spec.partial)
        for coords, dev in self.mesh.iter_coords():
            key = tuple(c for a, c in enumerate(coords) if a not in part)
            groups.setdefault(key, []).append(dev)
        return [tuple(g) for g in groups.values()]

    def partial_leaders(self) -> frozenset[int]:
        """Devices with coordinate 0 on every partial axis (all devices if not partial)."""
        part = self.spec.partial
        return frozenset(
            dev for coords, dev in self.mesh.iter_coords() if all(coords[a] == 0 for a in part)
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"mesh": self.mesh.to_dict(), "spec": str(self.spec)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Layout:
        """Inverse of :meth:`to_dict`."""
        return cls(DeviceMesh.from_dict(d["mesh"]), ShardingSpec.parse(d["spec"]))

    def __repr__(self) -> str:
        return f"Layout({self.mesh!r}, {str(self.spec)!r})"

    def __str__(self) -> str:
        return f"{self.spec}@{self.mesh}"

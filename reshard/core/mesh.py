"""DeviceMesh: an n-dimensional arrangement of global device ids."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reshard.core.errors import MeshError


def _as_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise MeshError(f"{what} must be an integer, got {value!r}")
    return int(value.__index__())


@dataclass(frozen=True, init=False)
class DeviceMesh:
    """A logical mesh of devices.

    Args:
        shape: mesh extent per axis, e.g. ``(2, 4)`` for 2 hosts of 4 devices.
        devices: global device ids laid out row-major over ``shape``; default
            ``range(prod(shape))``.
        axis_names: optional names of the axes (default ``("x0", "x1", ...)``).

    Two meshes may share devices; a transfer between the same device of two meshes
    is a local copy.
    """

    shape: tuple[int, ...]
    devices: tuple[int, ...]
    axis_names: tuple[str, ...] = field(default=())

    def __init__(
        self,
        shape: Sequence[int] | int,
        devices: Iterable[int] | None = None,
        axis_names: Sequence[str] | None = None,
    ) -> None:
        entries: Sequence[int] = (shape,) if isinstance(shape, int) else shape
        shape_t = tuple(_as_int(s, "mesh shape entry") for s in entries)
        if not shape_t:
            raise MeshError("mesh shape must have at least one axis, got (); use e.g. (1,)")
        if any(s < 1 for s in shape_t):
            raise MeshError(
                f"mesh shape entries must be >= 1, got {shape_t}; every axis needs a device"
            )
        size = math.prod(shape_t)
        if devices is None:
            devs = tuple(range(size))
        else:
            devs = tuple(_as_int(d, "device id") for d in devices)
        if len(devs) != size:
            raise MeshError(
                f"mesh of shape {shape_t} needs {size} devices, got {len(devs)}: {list(devs)}; "
                f"pass exactly prod(shape) device ids"
            )
        if any(d < 0 for d in devs):
            raise MeshError(f"device ids must be >= 0, got {list(devs)}")
        if len(set(devs)) != len(devs):
            dup = sorted({d for d in devs if devs.count(d) > 1})
            raise MeshError(
                f"mesh devices must be distinct, device(s) {dup} appear twice in {list(devs)}"
            )
        if axis_names is None:
            names = tuple(f"x{i}" for i in range(len(shape_t)))
        else:
            names = tuple(str(n) for n in axis_names)
            if len(names) != len(shape_t):
                raise MeshError(
                    f"mesh of {len(shape_t)} axes needs {len(shape_t)} axis names, got {names}"
                )
            if len(set(names)) != len(names):
                raise MeshError(f"axis names must be distinct, got {names}")
        object.__setattr__(self, "shape", shape_t)
        object.__setattr__(self, "devices", devs)
        object.__setattr__(self, "axis_names", names)

    @property
    def ndim(self) -> int:
        """Number of mesh axes."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of devices."""
        return len(self.devices)

    def coords(self, device: int) -> tuple[int, ...]:
        """Mesh coordinates of ``device`` (row-major position in ``devices``)."""
        try:
            flat = self.devices.index(device)
        except ValueError:
            raise MeshError(
                f"device {device} is not in mesh {self}; its devices are {list(self.devices)}"
            ) from None
        out = []
        for extent in reversed(self.shape):
            out.append(flat % extent)
            flat //= extent
        return tuple(reversed(out))

    def iter_coords(self) -> Iterable[tuple[tuple[int, ...], int]]:
        """Yield ``(coords, device)`` in row-major order."""
        for flat, dev in enumerate(self.devices):
            out = []
            for extent in reversed(self.shape):
                out.append(flat % extent)
                flat //= extent
            yield tuple(reversed(out)), dev

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"shape": list(self.shape), "devices": list(self.devices),
                "axis_names": list(self.axis_names)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceMesh:
        """Inverse of :meth:`to_dict`."""
        return cls(d["shape"], d["devices"], d.get("axis_names"))

    def __repr__(self) -> str:
        return (f"DeviceMesh({self.shape!r}, devices={list(self.devices)!r}, "
                f"axis_names={self.axis_names!r})")

    def __str__(self) -> str:
        d = self.devices
        span = (f"{d[0]}..{d[-1]}" if d == tuple(range(d[0], d[0] + len(d))) and len(d) > 1
                else ",".join(map(str, d)))
        return f"mesh{self.shape}[{span}]"

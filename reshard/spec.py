"""ShardingSpec: how a tensor's dims map onto mesh axes (split / replicate / partial).

Text form (as in Alpa and the cross-mesh resharding paper): one token per tensor
dim, ``R`` (replicated) or ``S`` followed by the mesh axes that split it, major
first (``S01`` splits over axis 0 then axis 1; ``S10`` the other way round), and an
optional partial-sum suffix ``+P<axes>``: ``"S0RR"``, ``"RS01R"``, ``"S1S0"``,
``"S0R+P1"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence, Union

from reshard.errors import SpecError

_TOKEN = re.compile(r"R|S\d+")


@dataclass(frozen=True)
class Shard:
    """Placement of one mesh axis: the axis splits tensor dim ``dim``."""

    dim: int

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class Replicate:
    """Placement of one mesh axis: every device along it holds the same data."""

    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True)
class Partial:
    """Placement of one mesh axis: the devices along it hold addends of a sum."""

    def __str__(self) -> str:
        return "P"


Placement = Union[Shard, Replicate, Partial]


def _parse_placement(p: object) -> Placement:
    if isinstance(p, (Shard, Replicate, Partial)):
        return p
    name = type(p).__name__
    # DTensor / OneFlow objects: Shard(dim=...), Replicate(), Partial()/_Partial
    if name == "Shard" and hasattr(p, "dim"):
        return Shard(int(p.dim))  # type: ignore[attr-defined]
    if name == "Replicate":
        return Replicate()
    if name in ("Partial", "_Partial"):
        return Partial()
    if isinstance(p, str):
        text = p.strip()
        m = re.fullmatch(r"S\((\d+)\)|S(\d+)", text)
        if m:
            return Shard(int(m.group(1) or m.group(2)))
        if text in ("R", "B"):
            return Replicate()
        if text == "P":
            return Partial()
    raise SpecError(
        f"unknown placement {p!r}; use Shard(d), Replicate(), Partial() or the strings "
        f"'S(d)', 'R', 'P'"
    )


@dataclass(frozen=True)
class ShardingSpec:
    """For each tensor dim, the mesh axes that split it (major to minor), plus the
    mesh axes over which the value is a partial sum.

    Attributes:
        dims: ``dims[d]`` is the tuple of mesh axes splitting tensor dim ``d``;
            ``()`` means the dim is not split.
        partial: sorted mesh axes over which devices hold addends of the value.
    """

    dims: tuple[tuple[int, ...], ...]
    partial: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        dims = tuple(tuple(int(a) for a in axes) for axes in self.dims)
        partial = tuple(sorted(int(a) for a in self.partial))
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "partial", partial)
        used: dict[int, str] = {}
        for d, axes in enumerate(dims):
            for a in axes:
                if a < 0:
                    raise SpecError(f"mesh axis must be >= 0, got {a} in dim {d} of {self}")
                if a in used:
                    raise SpecError(
                        f"mesh axis {a} is used twice ({used[a]} and tensor dim {d}) in "
                        f"'{self}'; each mesh axis splits at most one dim once, e.g. "
                        f"'{_example_fix(dims, d, a)}'"
                    )
                used[a] = f"tensor dim {d}"
        for a in partial:
            if a < 0:
                raise SpecError(f"partial mesh axis must be >= 0, got {a}")
            if a in used:
                raise SpecError(
                    f"mesh axis {a} both splits {used[a]} and is partial in '{self}'; a mesh "
                    f"axis has one placement: drop it from the split or from +P"
                )
        if len(set(partial)) != len(partial):
            raise SpecError(f"partial axes repeat in {partial}; list each axis once")

    # ----- construction -------------------------------------------------------------
    @classmethod
    def parse(cls, text: Union[str, "ShardingSpec"]) -> "ShardingSpec":
        """Parse the text form, e.g. ``"S0RR"``, ``"RS01R"``, ``"S0R+P1"``."""
        if isinstance(text, ShardingSpec):
            return text
        if not isinstance(text, str):
            raise SpecError(f"sharding spec must be a string like 'S0RR', got {text!r}")
        body, _, part = text.strip().partition("+")
        partial: tuple[int, ...] = ()
        if _:
            if not re.fullmatch(r"P\d+", part):
                raise SpecError(
                    f"bad partial suffix '+{part}' in {text!r}; write '+P' followed by mesh "
                    f"axis digits, e.g. 'S0R+P1'"
                )
            partial = tuple(int(c) for c in part[1:])
        pos = 0
        dims = []
        while pos < len(body):
            m = _TOKEN.match(body, pos)
            if not m:
                raise SpecError(
                    f"bad sharding spec {text!r} at position {pos} ({body[pos:]!r}); each "
                    f"tensor dim is 'R' or 'S' followed by mesh axis digits, e.g. 'S0RR', "
                    f"'RS01R', 'S0R+P1'"
                )
            tok = m.group(0)
            dims.append(() if tok == "R" else tuple(int(c) for c in tok[1:]))
            pos = m.end()
        return cls(tuple(dims), partial)

    @classmethod
    def replicated(cls, ndim: int) -> "ShardingSpec":
        """Fully replicated spec for a tensor of rank ``ndim``."""
        return cls(tuple(() for _ in range(ndim)))

    @classmethod
    def from_placements(
        cls, placements: Sequence[Placement | str | object], ndim: int
    ) -> "ShardingSpec":
        """Build a spec from per-mesh-axis placements (DTensor / SBP style).

        Args:
            placements: one placement per mesh axis: ``Shard(d)``, ``Replicate()``,
                ``Partial()`` (ours, DTensor's, or strings ``'S(d)'``, ``'R'``, ``'P'``).
                Several mesh axes sharding the same dim split it in mesh-axis order
                (lower axis major), as DTensor does.
            ndim: tensor rank.
        """
        dims: list[list[int]] = [[] for _ in range(ndim)]
        partial = []
        for axis, raw in enumerate(placements):
            p = _parse_placement(raw)
            if isinstance(p, Shard):
                d = p.dim + ndim if p.dim < 0 else p.dim
                if not 0 <= d < ndim:
                    raise SpecError(
                        f"placement {p} on mesh axis {axis} names tensor dim {p.dim}, out of "
                        f"range for a rank-{ndim} tensor; use 0..{ndim - 1}"
                    )
                dims[d].append(axis)
            elif isinstance(p, Partial):
                partial.append(axis)
        return cls(tuple(tuple(a) for a in dims), tuple(partial))

    def to_placements(self, mesh_ndim: int) -> tuple[Placement, ...]:
        """Per-mesh-axis placements; raises if a dim is split in non-increasing axis order."""
        self.check(mesh_ndim)
        out: list[Placement] = [Replicate() for _ in range(mesh_ndim)]
        for d, axes in enumerate(self.dims):
            if list(axes) != sorted(axes):
                raise SpecError(
                    f"dim {d} of '{self}' is split minor-axis-first ({axes}); per-axis "
                    f"placements can only say lower-axis-major, e.g. "
                    f"S{''.join(map(str, sorted(axes)))}"
                )
            for a in axes:
                out[a] = Shard(d)
        for a in self.partial:
            out[a] = Partial()
        return tuple(out)

    # ----- queries -------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        """Tensor rank the spec describes."""
        return len(self.dims)

    @property
    def is_partial(self) -> bool:
        """True if the value is a partial sum over some mesh axes."""
        return bool(self.partial)

    def used_axes(self) -> tuple[int, ...]:
        """Mesh axes that split some dim or are partial."""
        return tuple(sorted({a for axes in self.dims for a in axes} | set(self.partial)))

    def check(self, mesh_ndim: int, tensor_ndim: int | None = None) -> None:
        """Raise :class:`SpecError` if the spec does not fit a mesh / tensor rank."""
        for a in self.used_axes():
            if a >= mesh_ndim:
                raise SpecError(
                    f"'{self}' uses mesh axis {a}, out of range for a {mesh_ndim}-axis mesh; "
                    f"valid axes are 0..{mesh_ndim - 1}"
                )
        if tensor_ndim is not None and tensor_ndim != self.ndim:
            raise SpecError(
                f"'{self}' describes a rank-{self.ndim} tensor but the tensor has rank "
                f"{tensor_ndim}; write one token per dim, e.g. "
                f"'{'R' * tensor_ndim if tensor_ndim else '(a 0-d tensor has no tokens)'}'"
            )

    def __str__(self) -> str:
        body = "".join("R" if not axes else "S" + "".join(map(str, axes)) for axes in self.dims)
        if self.partial:
            body += "+P" + "".join(map(str, self.partial))
        return body

    def __repr__(self) -> str:
        return f"ShardingSpec.parse({str(self)!r})"


def _example_fix(dims: Iterable[tuple[int, ...]], d: int, a: int) -> str:
    fixed = []
    for i, axes in enumerate(dims):
        if i == d:
            axes = tuple(x for x in axes if x != a)
        fixed.append("R" if not axes else "S" + "".join(map(str, axes)))
    return "".join(fixed)

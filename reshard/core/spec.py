"""ShardingSpec: how a tensor's dims map onto mesh axes (split / replicate / partial).

Text form (as in Alpa and the cross-mesh resharding paper): one token per tensor
dim, ``R`` (replicated) or ``S`` followed by the mesh axes that split it, major
first (``S01`` splits over axis 0 then axis 1; ``S10`` the other way round), and an
optional partial-sum suffix ``+P<axes>``: ``"S0RR"``, ``"RS01R"``, ``"S1S0"``,
``"S0R+P1"``. An axis is one digit, or a number in brackets from 10 on
(``"S[12]R"``, ``"S0[10]"``: axes 0 then 10), so no string reads two ways.

Split rule (:class:`SplitRule`), which matters only when several mesh axes split one
dim whose size they do not divide:

- ``flat`` (the default, no marker): one ceil-chunking of the dim by the product of
  its axes (Alpa, XLA, JAX). Mesh ``(2, 2)``, ``"S01"``, 5 elements: ``0:2, 2:4, 4:5,
  5:5``.
- ``nested`` (suffix ``":nested"``): the first axis chunks the dim, the next chunks each
  piece, and so on (DTensor and OneFlow placements). Same example, ``"S01:nested"``:
  ``0:2, 2:3, 3:4, 4:5``.

A spec in which no dim is split by two or more axes is the same under both rules and
is always stored as ``flat``, so equal layouts compare equal.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from reshard.core.errors import SpecError
from reshard.core.unique_ids import group_of_each

_AXIS = r"(?:\d|\[\d+\])"
_TOKEN = re.compile(rf"R|S{_AXIS}+")
_AXES = re.compile(rf"{_AXIS}+")


class SplitRule(enum.Enum):
    """How several mesh axes split one tensor dim (see the module docstring)."""

    FLAT = "flat"
    NESTED = "nested"

    @classmethod
    def parse(cls, value: str | SplitRule) -> SplitRule:
        """The rule named ``value`` (case and blanks ignored).

        Raises:
            SpecError: for an unknown name, listing the valid ones.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            for member in cls:
                if member.value == value.strip().lower():
                    return member
        raise SpecError(
            f"unknown split rule {value!r}; valid split rules: {[m.value for m in cls]}")


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


Placement = Shard | Replicate | Partial


def _parse_placement(p: object) -> Placement:
    if isinstance(p, (Shard, Replicate, Partial)):
        return p
    foreign = _declared_placement(p)
    if foreign is not None:
        return foreign
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


def _asks(p: object, method: str) -> bool:
    """``p.method()`` is true (False when ``p`` has no such method)."""
    ask = getattr(p, method, None)
    return callable(ask) and bool(ask())


def _declared_placement(p: object) -> Placement | None:
    """Another library's placement read by what it declares, not by its class name:
    DTensor's placement API (``is_shard()`` with ``dim``, ``is_replicate()``,
    ``is_partial()`` with ``reduce_op``); None if ``p`` declares none of them."""
    if hasattr(p, "split_factor") and hasattr(p, "dim"):
        raise SpecError(
            f"placement {p!r} is a strided shard (FSDP2 + TP's right-to-left sharding), "
            f"which a spec cannot say alone; read it with its mesh and shape: "
            f"reshard.adapters.dtensor.to_layout(mesh, placements, shape)")
    if _asks(p, "is_shard") and hasattr(p, "dim"):
        return Shard(int(p.dim))
    if _asks(p, "is_replicate"):
        return Replicate()
    if _asks(p, "is_partial"):
        op = str(getattr(p, "reduce_op", "sum"))
        if op != "sum":
            raise SpecError(f"placement {p!r} reduces with {op!r}; a partial-sum axis sums "
                            f"(Partial('sum'))")
        return Partial()
    return None


def format_axes(axes: Iterable[int]) -> str:
    """Axes in the text form: one digit each, ``[n]`` from 10 on (``(0, 12)`` ->
    ``"0[12]"``)."""
    return "".join(str(a) if a < 10 else f"[{a}]" for a in axes)


def _parse_axes(text: str) -> tuple[int, ...]:
    return tuple(int(m.strip("[]")) for m in re.findall(_AXIS, text))


def _format_dims(dims: Iterable[tuple[int, ...]]) -> str:
    return "".join("R" if not axes else "S" + format_axes(axes) for axes in dims)


MAX_SPEC_CHARS = 4096
"""Length of the longest spec text parsed (a token per tensor dim, a few characters
each): a longer one is refused before any parsing work."""


@dataclass(frozen=True)
class ShardingSpec:
    """For each tensor dim, the mesh axes that split it (major to minor), plus the
    mesh axes over which the value is a partial sum, and the split rule.

    Attributes:
        dims: ``dims[d]`` is the tuple of mesh axes splitting tensor dim ``d``;
            ``()`` means the dim is not split.
        partial: sorted mesh axes over which devices hold addends of the value.
        rule: how several axes split one dim (:class:`SplitRule`, or its name);
            stored as ``FLAT`` when no dim has two or more axes (both rules agree).
    """

    dims: tuple[tuple[int, ...], ...]
    partial: tuple[int, ...] = ()
    rule: SplitRule = SplitRule.FLAT

    def __post_init__(self) -> None:
        dims = tuple(tuple(int(a) for a in axes) for axes in self.dims)
        partial = tuple(sorted(int(a) for a in self.partial))
        rule = SplitRule.parse(self.rule)
        if all(len(axes) < 2 for axes in dims):
            rule = SplitRule.FLAT
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "partial", partial)
        object.__setattr__(self, "rule", rule)
        used = group_of_each(
            dims, lambda a, d: SpecError(f"mesh axis must be >= 0, got {a} in dim {d} of {self}"),
            lambda a, first, d: SpecError(
                f"mesh axis {a} is used twice (tensor dim {first} and tensor dim {d}) in "
                f"'{self}'; each mesh axis splits at most one dim once, e.g. "
                f"'{_example_fix(dims, d, a)}'"))
        if partial and partial[0] < 0:  # sorted: the lowest axis first
            raise SpecError(f"partial mesh axis must be >= 0, got {partial[0]}")
        split = [a for a in partial if a in used]
        if split:
            raise SpecError(
                f"mesh axis {split[0]} both splits tensor dim {used[split[0]]} and is partial in "
                f"'{self}'; a mesh axis has one placement: drop it from the split or from +P"
            )
        if len(set(partial)) != len(partial):
            raise SpecError(f"partial axes repeat in {partial}; list each axis once")

    # ----- construction -------------------------------------------------------------
    @classmethod
    def parse(cls, text: str | ShardingSpec) -> ShardingSpec:
        """Parse the text form, e.g. ``"S0RR"``, ``"RS01R"``, ``"S0R+P1"``,
        ``"S01R:nested"``, ``"S[10]R"`` (letters in either case: ``"s0r"`` too)."""
        if isinstance(text, ShardingSpec):
            return text
        if not isinstance(text, str):
            raise SpecError(f"sharding spec must be a string like 'S0RR', got {text!r:.80}")
        if len(text) > MAX_SPEC_CHARS:
            raise SpecError(f"sharding spec text has {len(text)} characters, more than "
                            f"{MAX_SPEC_CHARS}; a spec has one short token per tensor dim "
                            f"(e.g. 'S0RR'): check what was passed")
        rest, colon, rule_name = text.strip().partition(":")
        rest = rest.upper()  # 's0r+p1' is 'S0R+P1' (a split rule's name stays as given)
        rule = SplitRule.parse(rule_name) if colon else SplitRule.FLAT
        body, plus, part = rest.partition("+")
        partial: tuple[int, ...] = ()
        if plus:
            if not (part.startswith("P") and _AXES.fullmatch(part[1:])):
                raise SpecError(
                    f"bad partial suffix '+{part}' in {text!r}; write '+P' followed by mesh "
                    f"axes (a digit each, [n] from 10 on), e.g. 'S0R+P1', 'S0R+P[10]'"
                )
            partial = _parse_axes(part[1:])
        pos = 0
        dims = []
        while pos < len(body):
            m = _TOKEN.match(body, pos)
            if not m:
                raise SpecError(
                    f"bad sharding spec {text!r} at position {pos} ({body[pos:]!r}); each "
                    f"tensor dim is 'R' or 'S' followed by mesh axes (a digit each, [n] from "
                    f"10 on), e.g. 'S0RR', 'RS01R', 'S[10]R', 'S0R+P1', 'S01R:nested'"
                )
            tok = m.group(0)
            dims.append(() if tok == "R" else _parse_axes(tok[1:]))
            pos = m.end()
        return cls(tuple(dims), partial, rule)

    @classmethod
    def replicated(cls, ndim: int) -> ShardingSpec:
        """Fully replicated spec for a tensor of rank ``ndim``."""
        return cls(tuple(() for _ in range(ndim)))

    @classmethod
    def from_placements(
        cls, placements: Sequence[Placement | str | object], ndim: int
    ) -> ShardingSpec:
        """Build a spec from per-mesh-axis placements (DTensor / SBP style).

        Several mesh axes sharding the same dim split it as DTensor does: in mesh-axis
        order (lower axis major), each axis chunking the previous axis's piece, so the
        spec gets the ``nested`` rule.

        Args:
            placements: one placement per mesh axis: ``Shard(d)``, ``Replicate()``,
                ``Partial()`` (ours, DTensor's, or strings ``'S(d)'``, ``'R'``, ``'P'``).
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
        return cls(tuple(tuple(a) for a in dims), tuple(partial), SplitRule.NESTED)

    @classmethod
    def from_sbp(cls, sbp: str | Sequence[str], ndim: int) -> ShardingSpec:
        """A spec from OneFlow's SBP signature: one of ``S(d)`` (split tensor dim ``d``),
        ``B`` (broadcast: replicated) or ``P`` (partial sum) per mesh axis, as a
        sequence or one string (``"(S(0), B)"``, ``"S(0), B"``, ``"S(0)B"``).

        Args:
            sbp: the signature.
            ndim: tensor rank.
        """
        if isinstance(sbp, str):
            text = sbp.strip()
            if text.startswith(("(", "[")) and text.endswith((")", "]")) and \
                    not re.fullmatch(r"S\(\d+\)", text):
                text = text[1:-1]
            parts = re.findall(r"S\(\s*\d+\s*\)|[A-Za-z]\w*|\S", text.replace(",", " "))
            items: list[str] = [p.replace(" ", "") for p in parts]
        else:
            items = [str(p) for p in sbp]
        if not items:
            raise SpecError(f"SBP signature {sbp!r} names no placement; give one per mesh "
                            f"axis, e.g. '(S(0), B)'")
        return cls.from_placements(items, ndim)

    def to_placements(self, mesh_ndim: int) -> tuple[Placement, ...]:
        """Per-mesh-axis placements (DTensor / SBP style), the inverse of
        :meth:`from_placements`.

        Raises:
            SpecError: if a dim is split minor-axis-first, or by several axes under the
                flat rule (placements always split nested).
        """
        self.check(mesh_ndim)
        out: list[Placement] = [Replicate() for _ in range(mesh_ndim)]
        for d, axes in enumerate(self.dims):
            if list(axes) != sorted(axes):
                raise SpecError(
                    f"dim {d} of '{self}' is split minor-axis-first ({axes}); per-axis "
                    f"placements can only say lower-axis-major, e.g. "
                    f"S{format_axes(sorted(axes))}"
                )
            if len(axes) > 1 and self.rule is SplitRule.FLAT:
                raise SpecError(
                    f"dim {d} of '{self}' is split flat by mesh axes {axes}, but placements "
                    f"split nested (the first axis chunks the dim, the next each piece), "
                    f"which differs on uneven sizes; use '{self.with_rule(SplitRule.NESTED)}' "
                    f"(identical when the dim's size divides by the axes' product)"
                )
            for a in axes:
                out[a] = Shard(d)
        for a in self.partial:
            out[a] = Partial()
        return tuple(out)

    def with_rule(self, rule: SplitRule | str) -> ShardingSpec:
        """This spec under another split rule."""
        return ShardingSpec(self.dims, self.partial, SplitRule.parse(rule))

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
        body = _format_dims(self.dims)
        if self.partial:
            body += "+P" + format_axes(self.partial)
        if self.rule is not SplitRule.FLAT:
            body += ":" + self.rule.value
        return body

    def __repr__(self) -> str:
        return f"ShardingSpec.parse({str(self)!r})"


def _example_fix(dims: Iterable[tuple[int, ...]], d: int, a: int) -> str:
    return _format_dims(
        tuple(x for x in axes if x != a) if i == d else axes for i, axes in enumerate(dims))

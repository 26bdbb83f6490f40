"""reshard's enums beside the service's protobuf enums, both ways.

The .proto names each member of a reshard enum ``PREFIX_NAME`` (``ScaleMode.BLOCK128``
is ``SCALE_MODE_BLOCK128``, ``TaskKind.COPY`` is ``TASK_KIND_COPY``), and its default
``PREFIX_UNSPECIFIED``; :class:`EnumPair` builds the two tables from those names, so a
member added to one side and not the other fails at import, not in a request.

:class:`ChoicePair` pairs the named choices of the search (``reshard.search.SCHEDULES``
and the like: a tuple of names, or an enum of them) the same way, by name: ``"eager-1f1b"``
is ``SCHEDULE_EAGER_1F1B`` (upper case, ``-`` as ``_``), and an enum member pairs by its
text value or its name, whichever the .proto has. A choice the .proto lacks is listed in
``unpaired`` (a test holds it empty) and refused in a request naming the valid ones, so a
schedule added to the search without its enum value breaks no other call.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from reshard.errors import ReshardError

E = TypeVar("E", bound=enum.Enum)


def pb_name(enum_pb: Any, value: int) -> str:
    """The protobuf name of ``value`` in ``enum_pb`` (the number where it has none)."""
    try:
        return str(enum_pb.Name(value))
    except ValueError:
        return str(value)


class EnumPair(Generic[E]):
    """A reshard enum and its protobuf enum.

    Attributes:
        enum_pb: the protobuf enum (its ``Name`` / ``Value``).
        to_pb: each reshard member's protobuf value.
        of: each protobuf value's reshard member (the default, ``*_UNSPECIFIED``, reads
            as ``unspecified`` where one is given, else it is not known).
    """

    def __init__(self, members: type[E], enum_pb: Any, prefix: str,
                 unspecified: E | None = None) -> None:
        self.enum_pb = enum_pb
        self.to_pb: Mapping[E, Any] = MappingProxyType(
            {m: enum_pb.Value(prefix + m.name) for m in members})
        inverse = {v: m for m, v in self.to_pb.items()}
        if unspecified is not None:
            inverse[enum_pb.Value(prefix + "UNSPECIFIED")] = unspecified
        self.of: Mapping[int, E] = MappingProxyType(inverse)

    def decode(self, value: int, what: str, error: type[ReshardError] = ReshardError) -> E:
        """The member of protobuf ``value``; ``error`` naming ``what`` and the valid
        names where it is none."""
        found = self.of.get(value)
        if found is None:
            raise error(f"{what} {pb_name(self.enum_pb, value)} is not known; valid: "
                        f"{[self.enum_pb.Name(v) for v in self.of]}")
        return found


def choice_keys(value: object) -> tuple[str, ...]:
    """The protobuf names (without prefix) a choice may pair with: its text (an enum
    member: its value where that is text, then its name) upper-cased, ``-`` as ``_``."""
    texts: list[str] = []
    if isinstance(value, enum.Enum):
        if isinstance(value.value, str):
            texts.append(value.value)
        texts.append(value.name)
    else:
        texts.append(str(value))
    return tuple(t.upper().replace("-", "_").replace(" ", "_") for t in texts)


class ChoicePair:
    """A search's named choices and their protobuf enum (module docstring).

    Args:
        choices: the Python side (names, or an enum's members), as the search takes them.
        enum_pb: the protobuf enum.
        prefix: its values' prefix (``"SCHEDULE_"``).
        what: the choice's name in messages (``"schedule"``).

    Attributes:
        to_pb: each paired choice's protobuf value.
        of: each protobuf value's choice (UNSPECIFIED is not one: the search's default).
        unpaired: the choices the .proto has no value for.
    """

    def __init__(self, choices: Iterable[Any], enum_pb: Any, prefix: str, what: str) -> None:
        self.enum_pb, self.prefix, self.what = enum_pb, prefix, what
        known = set(enum_pb.keys())
        to_pb: dict[Any, Any] = {}
        unpaired = []
        for c in choices:
            name = next((prefix + k for k in choice_keys(c) if prefix + k in known), None)
            if name is None:
                unpaired.append(c)
            else:
                to_pb[c] = enum_pb.Value(name)
        self.to_pb: Mapping[Any, Any] = MappingProxyType(to_pb)  # protobuf enum values
        self.of: Mapping[int, Any] = MappingProxyType({v: c for c, v in to_pb.items()})
        self.unpaired: tuple[Any, ...] = tuple(unpaired)

    def encode(self, value: object, error: type[ReshardError] = ReshardError) -> Any:
        """The protobuf value of ``value`` (a choice, or its text in any case); ``error``
        listing the valid ones where it is none."""
        keys = set(choice_keys(value))
        for c, v in self.to_pb.items():
            if keys & set(choice_keys(c)):
                return v
        raise error(f"unknown {self.what} {value!r}; valid: "
                    f"{', '.join(str(getattr(c, 'value', c)) for c in self.to_pb)}")

    def decode(self, value: int, error: type[ReshardError] = ReshardError) -> Any:
        """The choice of protobuf ``value``; ``error`` naming it and the valid names where
        it is none."""
        found = self.of.get(value)
        if found is None:
            raise error(f"{self.what} {pb_name(self.enum_pb, value)} is not known here; "
                        f"valid: {[self.enum_pb.Name(v) for v in self.of]}")
        return found


__all__ = ["ChoicePair", "EnumPair", "choice_keys", "pb_name"]

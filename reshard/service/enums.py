"""reshard's enums beside the service's protobuf enums, both ways.

The .proto names each member of a reshard enum ``PREFIX_NAME`` (``ScaleMode.BLOCK128``
is ``SCALE_MODE_BLOCK128``, ``TaskKind.COPY`` is ``TASK_KIND_COPY``), and its default
``PREFIX_UNSPECIFIED``; :class:`EnumPair` builds the two tables from those names, so a
member added to one side and not the other fails at import, not in a request.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
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


__all__ = ["EnumPair", "pb_name"]

"""Parsing a mode's name into its enum, once, at the API edge."""

from __future__ import annotations

import enum
from typing import TypeVar

from reshard.core.errors import OptionError, ReshardError

E = TypeVar("E", bound=enum.Enum)


def parse_choice(cls: type[E], value: str | E, what: str,
                 error: type[ReshardError] = OptionError) -> E:
    """The member of ``cls`` named ``value`` (case, surrounding blanks and ``-`` vs
    ``_`` ignored); ``error`` (an :class:`reshard.OptionError`) listing the valid names
    otherwise.

    Args:
        cls: the enum (its values are the names).
        value: a member or a name.
        what: the kind of choice, singular, for the message (``"strategy"``).
        error: the error class to raise (an OptionError unless the choice is of
            something with an error class of its own, e.g. a dtype's scale mode).
    """
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        for member in cls:
            if member.value.replace("-", "_") == key:
                return member
    plural = what[:-1] + "ies" if what.endswith("y") else what + "s"
    raise error(
        f"unknown {what} {value!r}; valid {plural}: {[m.value for m in cls]}")

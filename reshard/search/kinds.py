"""The search's choices as enums, parsed once at its edge (as
:func:`reshard.core.choice.parse_choice` parses the rest of the library's): the
pipeline schedule the objective models, how moves are priced while choosing, and how
a graph's layouts are chosen at fixed stages.

Each is a :class:`enum.StrEnum`, so the public strings keep working (``schedule="1f1b"``
is :attr:`SearchSchedule.ONE_F_ONE_B` and equals it) and a bad name is refused with a
:class:`reshard.SearchError` listing the valid ones.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeVar

from reshard.core.choice import parse_choice
from reshard.errors import SearchError

E = TypeVar("E", bound=enum.Enum)


class SearchSchedule(enum.StrEnum):
    """A pipeline schedule the search's objective models
    (:mod:`reshard.search.objective`); its name is the one
    :data:`reshard.pipeline.SCHEDULES` gives the same schedule."""

    ONE_F_ONE_B = "1f1b"
    EAGER_ONE_F_ONE_B = "eager-1f1b"
    INTERLEAVED_ONE_F_ONE_B = "interleaved-1f1b"
    ZB_V = "zb-v"
    DUALPIPE_V = "dualpipe-v"

    @property
    def traits(self) -> Traits:
        """How it places and times its pieces (:data:`TRAITS`)."""
        return TRAITS[self]

    @property
    def virtual(self) -> bool:
        """Whether a submesh holds several stages (chunks) of it."""
        return self.traits.chunks != 1

    def chunks(self, asked: int | None = None) -> int:
        """Its stages (chunks) per submesh: the schedule's own, or ``asked`` where it
        takes any (interleaved 1F1B; default 2)."""
        fixed = self.traits.chunks
        if fixed > 0:
            if asked is not None and asked != fixed:
                raise SearchError(f"schedule {self.value!r} runs {fixed} chunks per submesh, "
                                  f"got chunks={asked}; leave chunks unset")
            return fixed
        return 2 if asked is None else asked


@dataclass(frozen=True)
class Traits:
    """What the objective needs of a schedule.

    Attributes:
        chunks: stages per submesh (0: any, the caller's ``chunks``).
        placement: ``"interleaved"`` (piece ``j`` on submesh ``j mod p``) or ``"v"``
            (submesh ``s`` holds pieces ``s`` and ``2 p - 1 - s``), as
            :class:`reshard.pipeline.Schedule` names them.
        eager: a stage's moves hide behind its compute (its period is the larger of
            the two, not their sum).
        fewest: the fewest microbatches it runs per stage (DualPipeV: 2).
    """

    chunks: int
    placement: str = "interleaved"
    eager: bool = False
    fewest: int = 0


TRAITS: dict[SearchSchedule, Traits] = {
    SearchSchedule.ONE_F_ONE_B: Traits(1),
    SearchSchedule.EAGER_ONE_F_ONE_B: Traits(1, eager=True),
    SearchSchedule.INTERLEAVED_ONE_F_ONE_B: Traits(0),
    SearchSchedule.ZB_V: Traits(2, "v"),
    SearchSchedule.DUALPIPE_V: Traits(2, "v", fewest=2),
}
"""Each schedule's traits (a table, not a chain of ifs)."""


class Moves(enum.StrEnum):
    """How a search prices moves while it chooses."""

    PRICED = "priced"
    FREE = "free"


class Method(enum.StrEnum):
    """How :func:`reshard.search.search_graph` chooses layouts at fixed stages."""

    DESCENT = "descent"
    MCMC = "mcmc"


def parse(cls: type[E], value: object, what: str) -> E:
    """The member of ``cls`` named ``value`` (a member, or its name: case, blanks and
    ``-`` / ``_`` ignored); a SearchError listing the valid names otherwise."""
    return parse_choice(cls, value, what, SearchError)  # type: ignore[arg-type]


SEARCH_SCHEDULES = tuple(s.value for s in SearchSchedule)
"""The schedules' names (``reshard.search.SCHEDULES``, its old name, is this)."""

MOVES = tuple(m.value for m in Moves)
"""How moves may be priced, by name."""

METHODS = tuple(m.value for m in Method)
"""A graph's layout methods, by name."""


__all__ = ["METHODS", "MOVES", "SEARCH_SCHEDULES", "TRAITS", "Method", "Moves",
           "SearchSchedule", "Traits", "parse"]

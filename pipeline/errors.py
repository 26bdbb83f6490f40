"""The error raised for malformed pipeline schedules, actions and costs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reshard.errors import ReshardError

if TYPE_CHECKING:
    from reshard.pipeline.validate import Problem


class ScheduleError(ReshardError):
    """A schedule, action text, schedule name or cost table is invalid.

    A :class:`ValueError` (through :class:`reshard.errors.ReshardError`), so callers can
    catch either. When raised by :func:`reshard.pipeline.check`, ``problems`` holds
    every problem found, the first of which is described in the message.

    Attributes:
        problems: The problems found by validation, in report order (empty when the
            error is not about a whole schedule).
    """

    def __init__(self, message: str, problems: tuple[Problem, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems

"""The error raised for malformed pipeline schedules, actions and costs."""

from __future__ import annotations

from typing import Any

from reshard.core.errors import ReshardError


class ScheduleError(ReshardError):
    """A schedule, action text, schedule name or cost table is invalid.

    A :class:`ValueError` (through :class:`reshard.core.errors.ReshardError`), so callers can
    catch either. When raised by :func:`reshard.pipeline.check`, ``problems`` holds
    every problem found, the first of which is described in the message.

    Attributes:
        problems: The problems found by validation
            (:class:`reshard.pipeline.validate.Problem` values), in report order (empty
            when the error is not about a whole schedule). Typed loosely: validation
            imports this module, and this one names nothing above it, not even for types.
    """

    def __init__(self, message: str, problems: tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems

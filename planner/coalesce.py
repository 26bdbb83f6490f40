"""Deprecated: moved to :mod:`reshard.planner.schedule.coalesce` (the planner by stage, issue 46);
this path goes in the next release."""

import warnings
from typing import Any

from reshard.planner.schedule import coalesce as _moved

warnings.warn("reshard.planner.coalesce moved to reshard.planner.schedule.coalesce; the old path goes in "
              "the next release", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

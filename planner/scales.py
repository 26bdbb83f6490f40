"""Deprecated: moved to :mod:`reshard.planner.values.scales` (the planner by stage, issue 46);
this path goes in the next release."""

import warnings
from typing import Any

from reshard.planner.values import scales as _moved

warnings.warn("reshard.planner.scales moved to reshard.planner.values.scales; the old path goes in "
              "the next release", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

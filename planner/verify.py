"""Deprecated: moved to :mod:`reshard.planner.costing.verify` (the planner by stage, issue 46);
this path goes in the next release."""

import warnings
from typing import Any

from reshard.planner.costing import verify as _moved

warnings.warn("reshard.planner.verify moved to reshard.planner.costing.verify; the old path goes in "
              "the next release", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

"""Deprecated: moved to :mod:`reshard.planner.passes.allreduce` (the planner's passes, issue 65);
this path goes in the next release."""

import warnings
from typing import Any

from reshard.planner.passes import allreduce as _moved

warnings.warn("reshard.planner.search.allreduce moved to reshard.planner.passes.allreduce; the old path goes "
              "in the next release", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

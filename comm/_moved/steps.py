"""Deprecated: moved to :mod:`reshard.comm.engine.steps` (the data plane's engine and bootstrap folders,
issue 65); this path goes in the next release."""

import warnings
from typing import Any

from reshard.comm.engine import steps as _moved

warnings.warn("reshard.comm.steps moved to reshard.comm.engine.steps; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

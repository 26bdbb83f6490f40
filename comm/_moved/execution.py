"""Deprecated: moved to :mod:`reshard.comm.engine.execution` (the data plane's engine and bootstrap folders,
issue 65); this path goes in the next release."""

import warnings
from typing import Any

from reshard.comm.engine import execution as _moved

warnings.warn("reshard.comm.execution moved to reshard.comm.engine.execution; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

"""Deprecated: moved to :mod:`reshard.comm.engine.step_ops` (the data plane's engine and bootstrap folders,
issue 65); this path goes in the next release."""

import warnings
from typing import Any

from reshard.comm.engine import step_ops as _moved

warnings.warn("reshard.comm.step_ops moved to reshard.comm.engine.step_ops; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

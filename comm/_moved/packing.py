"""Deprecated: moved to :mod:`reshard.comm.engine.packing` (the data plane's engine and bootstrap folders,
issue 65); this path goes in the next release."""

import warnings
from typing import Any

from reshard.comm.engine import packing as _moved

warnings.warn("reshard.comm.packing moved to reshard.comm.engine.packing; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

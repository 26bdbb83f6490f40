"""Deprecated: moved to :mod:`reshard.comm.bootstrap.sockets` (the data plane's engine and bootstrap folders,
issue 65); this path goes in the next release."""

import warnings
from typing import Any

from reshard.comm.bootstrap import sockets as _moved

warnings.warn("reshard.comm.sockets moved to reshard.comm.bootstrap.sockets; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

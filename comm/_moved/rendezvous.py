"""Deprecated: moved to :mod:`reshard.comm.bootstrap.rendezvous` (the data plane's engine and bootstrap folders,
issue 65); this path goes in the next release."""

import warnings
from typing import Any

from reshard.comm.bootstrap import rendezvous as _moved

warnings.warn("reshard.comm.rendezvous moved to reshard.comm.bootstrap.rendezvous; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

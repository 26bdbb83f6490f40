"""Deprecated: moved to :mod:`reshard.testbed` (issue 65); this path goes in the next
release. ``python -m reshard.microbench.infra.testbed`` still runs its ``main``."""

import sys
import warnings
from typing import Any

from reshard import testbed as _moved

warnings.warn("reshard.microbench.infra.testbed moved to reshard.testbed; the old path goes in "
              "the next release", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)


if __name__ == "__main__":
    sys.exit(_moved.main())

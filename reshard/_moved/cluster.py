"""``reshard.cluster`` is :mod:`reshard.core.cluster` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import cluster as _moved

sys.modules[__name__] = _moved

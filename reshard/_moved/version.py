"""``reshard.version`` is :mod:`reshard.core.version` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import version as _moved

sys.modules[__name__] = _moved

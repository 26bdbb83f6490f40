"""``reshard.spec`` is :mod:`reshard.core.spec` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import spec as _moved

sys.modules[__name__] = _moved

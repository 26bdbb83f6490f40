"""``reshard.mesh`` is :mod:`reshard.core.mesh` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import mesh as _moved

sys.modules[__name__] = _moved

"""``reshard.casting`` is :mod:`reshard.core.casting` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import casting as _moved

sys.modules[__name__] = _moved

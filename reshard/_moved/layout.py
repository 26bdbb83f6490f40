"""``reshard.layout`` is :mod:`reshard.core.layout` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import layout as _moved

sys.modules[__name__] = _moved

"""``reshard.lazy`` is :mod:`reshard.core.lazy` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import lazy as _moved

sys.modules[__name__] = _moved

"""``reshard.lru`` is :mod:`reshard.core.lru` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import lru as _moved

sys.modules[__name__] = _moved

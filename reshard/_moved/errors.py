"""``reshard.errors`` is :mod:`reshard.core.errors` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import errors as _moved

sys.modules[__name__] = _moved

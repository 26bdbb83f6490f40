"""``reshard.tables`` is :mod:`reshard.core.tables` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import tables as _moved

sys.modules[__name__] = _moved

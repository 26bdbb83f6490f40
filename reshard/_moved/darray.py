"""``reshard.darray`` is :mod:`reshard.core.darray` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import darray as _moved

sys.modules[__name__] = _moved

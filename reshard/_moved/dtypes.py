"""``reshard.dtypes`` is :mod:`reshard.core.dtypes` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import dtypes as _moved

sys.modules[__name__] = _moved

"""``reshard.unique_ids`` is :mod:`reshard.core.unique_ids` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import unique_ids as _moved

sys.modules[__name__] = _moved

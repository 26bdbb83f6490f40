"""``reshard.packed`` is :mod:`reshard.core.packed` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import packed as _moved

sys.modules[__name__] = _moved

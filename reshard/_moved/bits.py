"""``reshard.bits`` is :mod:`reshard.core.bits` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import bits as _moved

sys.modules[__name__] = _moved

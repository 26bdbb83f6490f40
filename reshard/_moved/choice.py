"""``reshard.choice`` is :mod:`reshard.core.choice` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import choice as _moved

sys.modules[__name__] = _moved

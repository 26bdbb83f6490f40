"""``reshard.presets`` is :mod:`reshard.core.presets` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import presets as _moved

sys.modules[__name__] = _moved

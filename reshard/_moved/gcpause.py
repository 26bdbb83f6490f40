"""``reshard.gcpause`` is :mod:`reshard.core.gcpause` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import gcpause as _moved

sys.modules[__name__] = _moved

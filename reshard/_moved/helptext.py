"""``reshard.helptext`` is :mod:`reshard.core.helptext` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import helptext as _moved

sys.modules[__name__] = _moved

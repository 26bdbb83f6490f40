"""``reshard.cliargs`` is :mod:`reshard.core.cliargs` (the core layer's folder, issue 65): this
path names the same module object."""

import sys

from reshard.core import cliargs as _moved

sys.modules[__name__] = _moved

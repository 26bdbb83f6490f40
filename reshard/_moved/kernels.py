"""``reshard.kernels`` is :mod:`reshard.core.kernels` (the core layer's folder, issue 65):
this path, and each of its modules', names the same module objects."""

import sys

from reshard.core import kernels as _moved
from reshard.core.kernels import cast_geometry, cast_launch, cast_source

sys.modules[__name__] = _moved
for _module in (cast_geometry, cast_launch, cast_source):
    sys.modules[f"{__name__}.{_module.__name__.rpartition('.')[2]}"] = _module

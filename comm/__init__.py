"""The data plane: the ``Backend`` protocol and its registry (``backend.py``), the
backends (``backends/``), how ranks meet (``bootstrap/``), the device engine
(``engine/``), per-device programs (``program.py``), one device's entry point
(``executor.py``), the worker (``worker.py``, its calls ``calls.py``), launchers
(``launchers/``) and SPMD planning per rank (``spmd.py``)."""

import os

# One release: the modules that moved into engine/ and bootstrap/ (issue 65) still
# import from their old paths (reshard.comm.execution, ...): the aliases in _moved/,
# each warning and forwarding to the moved module.
__path__.append(os.path.join(os.path.dirname(__file__), "_moved"))

"""Test infrastructure that the library never imports: the emulated multi-host testbed's
machine links and namespaces (:mod:`.host_net`; the testbed itself is
:mod:`reshard.testbed`), the Ray cluster on it (:mod:`.ray_cluster`) and exit guards
(:mod:`.exit_guard`). Benchmarks and tests build them and hand the library a placement
(``Runtime(..., netns=testbed)``); see docs/architecture.md."""

import os

# One release: reshard.microbench.infra.testbed (now reshard.testbed) still imports,
# from the alias in _moved/, which warns and forwards.
__path__.append(os.path.join(os.path.dirname(__file__), "_moved"))

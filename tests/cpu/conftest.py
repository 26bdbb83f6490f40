"""Fixtures of the real-process tier: one Ray runtime per test session, and a gloo and
a tcp runtime per module for modules that need no other (those that do define their own
``rt``, which takes precedence)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """Ray, started once for the session (2 CPUs, no dashboard) and always shut down.

    A session that was already connected to Ray is used as is and left running.
    """
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 namespace="reshard-tests")
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


@pytest.fixture(scope="module", params=["gloo", "tcp", "nixl"])
def rt(request):
    """Eight workers of each CPU data plane, ``gloo``, ``tcp`` and ``nixl`` (process
    launcher), on the four hosts of :data:`tests.cpu._helpers.WORLD`, shared by a
    module's tests (nixl's skipped where its extra is not installed)."""
    from reshard.runtime import Runtime

    if request.param == "nixl":
        pytest.importorskip("nixl", reason="the nixl extra is not installed")

    from ._helpers import WORLD

    with Runtime(request.param, WORLD, "process", timeout=30) as runtime:
        yield runtime

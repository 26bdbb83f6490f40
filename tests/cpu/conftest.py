"""Fixtures of the real-process tier: one Ray runtime per test session."""

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

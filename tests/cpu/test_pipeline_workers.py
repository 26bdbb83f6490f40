"""The pipeline runtime on real worker processes (gloo; process and Ray launchers):
the MLP example's numbers equal the numpy reference."""

from __future__ import annotations

import pytest

from reshard.pipeline.examples import mlp

pytestmark = pytest.mark.cpu


@pytest.mark.timeout(240)
@pytest.mark.parametrize("schedule,chunks,kinds", [
    ("1f1b", 1, ("dp", "col", "dp")),
    ("eager-1f1b", 1, ("dp", "col", "dp")),
    ("zb-h1", 1, ("col", "dp")),
    ("interleaved-1f1b", 2, ("dp", "col", "dp", "dp")),
])
def test_mlp_on_gloo_processes(schedule, chunks, kinds):
    rows = mlp.train("gloo", "process", schedule, kinds, steps=2, chunks=chunks,
                     log=lambda *_: None)
    assert all(r["max_abs_diff"] < 1e-9 for r in rows), rows


@pytest.mark.timeout(240)
def test_mlp_on_ray_actors(ray_session):
    rows = mlp.train("gloo", "ray", "eager-1f1b", ("dp", "col"), steps=2, log=lambda *_: None)
    assert all(r["max_abs_diff"] < 1e-9 for r in rows), rows

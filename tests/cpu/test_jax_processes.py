"""Multi-controller JAX: reshard's ProcessMove across JAX processes, beside JAX's own
path (microbench/jax_processes.py, shrunk). Skipped without jax."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")


@pytest.mark.timeout(300)
def test_process_moves_across_jax_processes_where_jax_refuses():
    """microbench/jax_processes.py, shrunk: 8 JAX processes of one CPU device each; every
    destination shard of reshard's ProcessMove (and of JAX's jit where it has a path)
    equals the source's slice in every process (checked inside, a mismatch fails the
    worker), and JAX refuses the move between disjoint device sets."""
    from reshard.microbench import jax_processes

    rows = jax_processes.run(repeats=1, rows=64, measured=False)
    assert [r["case"] for r in rows] == [c[0] for c in jax_processes.CASES]
    assert all(r["reshard_ms"] > 0 for r in rows)
    same = [r for r in rows if r["jax_refused"] is None]
    assert len(same) == 3 and all(r["jax_ms"] > 0 for r in same)
    disjoint = rows[-1]
    assert "same set of devices" in disjoint["jax_refused"] and "jax_ms" not in disjoint

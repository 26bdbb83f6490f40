"""ALLREDUCE tasks on the real CPU data planes: gloo (its ring, ``dist.all_reduce``)
and tcp (no all-reduce: a reduction into the first member, then a broadcast of the
sum), eight worker processes on four hosts. Every shard byte for byte, for the plans
the all-reduce-first candidate makes (reshard.planner.passes.allreduce) where partial sums'
meshes coincide: the sum landing in place (Partial -> Replicate), kept in the source
copy and copied on (Partial -> Shard), moved on between devices ((P, S) -> (R, S')),
in float32, bfloat16 (summed in float32) and int16 (widened)."""

from __future__ import annotations

import numpy as np
import pytest

from reshard import DeviceMesh, Layout

from ..common import allreduce_first_moves, sample

pytestmark = pytest.mark.cpu

CASES = [
    ((8,), "RR+P0", "RR"),
    ((8,), "RR+P0", "S0R"),
    ((2, 4), "S1R+P0", "RS1"),
    ((4, 2), "RS0+P1", "S0S1"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int16"])
@pytest.mark.parametrize("shape,s,d", CASES)
def test_allreduce_first_bytes(rt, shape, s, d, dtype):
    rng = np.random.default_rng(11)
    value = sample(rng, (37, 10), dtype)
    mesh = DeviceMesh(shape)
    x, y = allreduce_first_moves(rt, value, Layout(mesh, s), Layout(mesh, d), rng)
    rt.free(x, y)

"""Shared helpers for the pure unit tests."""

from __future__ import annotations

import numpy as np
import pytest

import reshard
from reshard.planner.ir import ReshardPlan, TaskKind


def wire_bytes(plan: ReshardPlan) -> int:
    """Bytes a plan puts on the wire, from its tasks alone: a send carries its box once,
    a broadcast once per receiver, a reduction once per contributor, an all-gather each
    member's (padded) piece to every other member."""
    total = 0
    for t in plan.tasks:
        if t.kind is TaskKind.SEND:
            total += t.nbytes
        elif t.kind in (TaskKind.BROADCAST, TaskKind.REDUCE):
            total += t.nbytes * len(t.receivers)
        elif t.kind is TaskKind.ALLGATHER:
            itemsize = np.dtype(plan.tensors[t.tensor].dtype).itemsize
            m = max(int(np.prod([b - a for a, b in p])) for p in t.pieces)
            k = len(t.receivers)
            total += m * itemsize * k * (k - 1)
    return total


def check_shards(rt: reshard.Runtime, y, value: np.ndarray) -> None:
    """Every destination shard equals the expected slice of ``value`` byte for byte
    (partial destinations: leaders hold the value, the other addends zeros)."""
    shards = rt.shards(y)
    leaders = y.layout.partial_leaders()
    for d, sl in y.layout.index_map(value.shape).items():
        want = value[sl] if d in leaders else np.zeros_like(value[sl])
        got = shards[d]
        assert got.shape == want.shape, (d, got.shape, want.shape)
        assert got.dtype == want.dtype
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), f"device {d} differs"


@pytest.fixture
def local_runtime():
    with reshard.Runtime(backend="local") as rt:
        yield rt

"""gloo's pieces on worker processes: a box received into scratch memory is copied
into its (strided) place as its pieces land, not after the step; sends and the
all-gather's exchange go in pieces too. Every destination shard exact, with boxes of
several pieces, several relays in one step, and several all-gathers per pair."""

from __future__ import annotations

import numpy as np
import pytest

from reshard import DeviceMesh, Layout
from reshard.comm.backends.gloo import CHAIN_PIECE
from reshard.planner.values.tasks import TaskKind

from ._helpers import check_shards, sample

pytestmark = pytest.mark.cpu


@pytest.mark.timeout(180)
def test_strided_boxes_unpacked_as_pieces_land(rt):
    """The paper's case 3 at a size where every box is strided in its destination
    shard and spans several of gloo's pieces: each chain's relay and leaf copy the
    box out of scratch as pieces land (several relays in one step, polled). Every
    destination shard exact."""
    src = Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "RS0R")
    dst = Layout(DeviceMesh((2, 2), [4, 5, 6, 7]), "S0RR")
    shape, dtype = (96, 90, 67), "int32"  # boxes (48, 45, 67): 579 KB, 2.2 pieces
    plan = rt.plan(rt.put(np.zeros(shape, dtype), src), dst, "broadcast")
    boxes = dst.boxes(shape)
    assert all(t.nbytes > 2 * CHAIN_PIECE and t.box != boxes[t.receivers[0]]
               for t in plan.tasks)
    rng = np.random.default_rng(3)
    value = sample(rng, shape, dtype)
    x = rt.put(value, src)
    check_shards(rt, rt.execute(plan, [x])[0], value)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", ["send_recv", "allgather"])
def test_pieced_sends_and_all_gathers(rt, strategy):
    """Case 3 again with point-to-point sends (strided receives landing piece by
    piece) and with the all-gather baseline (each host's two devices exchange their
    halves in pieces, two all-gathers per pair in one step)."""
    src = Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "RS0R")
    dst = Layout(DeviceMesh((2, 2), [4, 5, 6, 7]), "S0RR")
    shape, dtype = (96, 90, 67), "float64"
    value = sample(np.random.default_rng(5), shape, dtype)
    x = rt.put(value, src)
    plan = rt.plan(x, dst, strategy)
    kind = TaskKind.SEND if strategy == "send_recv" else TaskKind.ALLGATHER
    assert max(t.nbytes for t in plan.tasks if t.kind is kind) > 2 * CHAIN_PIECE
    check_shards(rt, rt.execute(plan, [x])[0], value)


@pytest.mark.timeout(180)
def test_the_plans_piece_size_on_gloo(rt):
    """A plan whose cluster passes relays 99,999 bytes at a time (not gloo's own 256
    KiB; rounded down to 99,968, whole 64 bytes) runs in pieces of that size: chains
    and relays of case 3, point-to-point receives and a fused sum of four addends
    whose running sums are added piece by piece, every destination shard exact."""
    import dataclasses

    from reshard import ReshardPlan

    from ._helpers import WORLD, addends
    from .test_fused_gloo import CASES, fused_plan

    cluster = dataclasses.replace(WORLD, relay_piece=99_999)
    src = Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "RS0R")
    dst = Layout(DeviceMesh((2, 2), [4, 5, 6, 7]), "S0RR")
    shape, dtype = (96, 90, 67), "float64"
    value = sample(np.random.default_rng(11), shape, dtype)
    x = rt.put(value, src)
    for strategy in ("broadcast", "send_recv"):
        base = rt.plan(x, dst, strategy)
        plan = ReshardPlan(base.tensors, base.tasks, base.strategy, cluster)
        assert max(t.nbytes for t in plan.tasks) > 4 * 99_999
        check_shards(rt, rt.execute(plan, [x])[0], value)
    shape2, dtype2, src2, dst2 = CASES[1]  # four addends over two hosts, float32
    fused = fused_plan(shape2, dtype2, src2, dst2)
    plan = ReshardPlan(fused.tensors, fused.tasks, fused.strategy, cluster)
    rng = np.random.default_rng(12)
    value2 = sample(rng, shape2, dtype2)
    x2 = rt.put_shards(addends(rng, value2, src2), src2, value2.shape, value2.dtype)
    check_shards(rt, rt.execute(plan, [x2])[0], value2)

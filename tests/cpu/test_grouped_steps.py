"""Plan steps with several tasks per device, run concurrently by the workers: planned
layouts regrouped into one step per phase (reductions, transfers, all-gathers), and
crossing chain broadcasts that one device relays side by side, on gloo (process
launcher), the local reference and the fake NCCL; every destination shard byte-exact.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

import reshard
from reshard import DeviceMesh, Layout
from reshard.planner.ir import ReshardPlan
from reshard.planner.values.tasks import TaskKind
from reshard.runtime import Runtime

from ..common import put_value
from ._helpers import STRATEGIES, WORLD, check_shards, fake_nccl_runtime, rank_results, sample

pytestmark = pytest.mark.cpu

A = DeviceMesh((2, 2), [0, 1, 2, 3])
B = DeviceMesh((2, 2), [4, 5, 6, 7])
SHIFTED = DeviceMesh((2, 2), [2, 3, 4, 5])  # shares a host and devices 2, 3 with A

# (name, shape, dtype, source, destination)
CASES = (
    ("transpose", (8, 6), "float32", Layout(A, "S0R"), Layout(B, "RS0")),
    ("two-axes", (9, 10), "int32", Layout(A, "S01R"), Layout(B, "RS10")),
    ("partial", (8, 6), "float32", Layout(A, "S0R+P1"), Layout(B, "RS0")),
    ("partial-int16", (7, 6), "int16", Layout(A, "S0R+P1"), Layout(B, "RS0")),
    ("overlapping", (10, 4), "float64", Layout(A, "S0R"), Layout(SHIFTED, "RS0")),
    ("uneven", (7, 5), "int64", Layout(A, "S1S0"), Layout(B, "RS01")),
)

# One step per phase: every reduction, then every transfer, then every all-gather. No
# task reads what its own step writes (a transfer of a reduced piece waits one step,
# an all-gather reads what the transfers delivered).
PHASE = {TaskKind.REDUCE: 0, TaskKind.COPY: 1, TaskKind.SEND: 1, TaskKind.BROADCAST: 1,
         TaskKind.ALLGATHER: 2}


def by_phase(plan: ReshardPlan) -> ReshardPlan:
    """``plan`` with one step per phase (stable: plan order inside a step)."""
    tasks = sorted((dataclasses.replace(t, step=PHASE[t.kind]) for t in plan.tasks),
                   key=lambda t: t.step)
    return ReshardPlan(plan.tensors, tuple(tasks), plan.strategy, plan.cluster)


def busiest(plan: ReshardPlan) -> int:
    """The most tasks one device has in one step."""
    count = Counter((t.step, d) for t in plan.tasks for d in set(t.devices))
    return max(count.values())


def run_regrouped(rt, case) -> None:
    """The case's value, resharded with every strategy's plan regrouped by phase."""
    name, shape, dtype, src, dst = case
    rng = np.random.default_rng(len(name))
    value = sample(rng, shape, dtype)
    if dtype == "int16":
        value = value * 700  # sums of the addends wrap around
    x = put_value(rt, value, src, rng)
    grouped = 0
    for strategy in STRATEGIES:
        plan = by_phase(rt.plan(x, dst, strategy))
        grouped = max(grouped, busiest(plan))
        (y,) = rt.execute(plan, [x])
        check_shards(rt, y, value)
        rt.free(y)
    rt.free(x)
    assert grouped > 1, "no device took part in several tasks of one step"


# Four halves of rows, each relayed by a chain broadcast through the other destination
# device, all in one step: device 4 passes rows 0 and 1 on to 6 while 6 passes rows 2
# and 3 on to 4 (the same pair both ways, several pieces each, so pieces of different
# chains arrive interleaved and are forwarded as they come, told apart by their tags).
CHAIN_ROWS = 4
CHAIN_COLS = 300_000  # 1.2 MB of float32 per row: several pieces of gloo's chain


def crossing_chains(rt, x, dst: Layout) -> ReshardPlan:
    """The broadcast strategy's first plan (its chains: the search would keep point-to-
    point sends here, within RELAY_GAIN) of ``x`` to ``dst`` with every task in step 0 and
    each row's chain made root -> 4 -> 6 (rows 0, 1) or root -> 6 -> 4 (rows 2, 3)."""
    from reshard.planner.plan import plan_tasks
    from reshard.planner.values.strategy import Strategy

    plan = rt.plan(x, dst, "broadcast")
    tasks = []
    first, _ = plan_tasks(plan.tensors, plan.cluster, Strategy.BROADCAST, fan_out=False)
    for t in first:
        assert t.kind is TaskKind.BROADCAST and sorted(t.receivers) == [4, 6], t
        chain = (4, 6) if t.box[0][0] < CHAIN_ROWS // 2 else (6, 4)
        tasks.append(dataclasses.replace(t, step=0, receivers=chain))
    assert len(tasks) == CHAIN_ROWS
    return ReshardPlan(plan.tensors, tuple(tasks), plan.strategy, plan.cluster)


def run_crossing_chains(rt) -> None:
    src = Layout(DeviceMesh((4,), [0, 1, 2, 3]), "S0R")  # one row per source device
    dst = Layout(DeviceMesh((2,), [4, 6]), "RR")  # hosts 2 and 3: every chain crosses hosts
    value = np.arange(CHAIN_ROWS * CHAIN_COLS, dtype=np.float32).reshape(CHAIN_ROWS, -1)
    x = rt.put(value, src)
    plan = crossing_chains(rt, x, dst)
    for _ in range(2):  # the same tags again: the second run must not mix with the first
        (y,) = rt.execute(plan, [x])
        check_shards(rt, y, value)
        rt.free(y)
    rt.free(x)


@pytest.mark.timeout(30)
def test_scratch_is_sized_for_the_fullest_step():
    """Each task of a step has its own scratch region (aligned); one byte buffer fits
    the step whose tasks need most together, as the planner's staging says."""
    from reshard.comm.backends.local import LocalBackend, LocalFabric
    from reshard.comm.worker import DeviceWorker
    from reshard.dtypes import itemsize
    from reshard.planner.schedule.staging import (
        ALIGN,
        region_bytes,
        scratch_elems,
        staging_by_device,
    )

    _, shape, dtype, src, dst = CASES[2]
    plan = by_phase(reshard.plan(shape, dtype, src, dst, cluster=WORLD, strategy="allgather"))
    assert busiest(plan) > 1
    staged = staging_by_device(plan.tasks, plan.tensors)
    for d in plan.devices:
        worker = DeviceWorker(d, LocalBackend(d, LocalFabric()))
        worker.load_plan(0, plan)
        lp = worker.plans[0]
        assert lp.num_tasks == sum(d in t.devices for t in plan.tasks)
        need = [[region_bytes(scratch_elems(st.task, d) * itemsize(dtype)) for st in step]
                for step in lp.steps]
        assert lp.scratch.nbytes == max(sum(n) for n in need) == staged.get(d, 0)
        for step, sizes in zip(lp.steps, need):
            assert [st.offset for st in step] == [sum(sizes[:k]) for k in range(len(step))]
            assert all(st.offset % ALIGN == 0 for st in step)


@pytest.fixture(scope="module", params=["gloo", "local"])
def rt(request):
    launcher = "process" if request.param == "gloo" else "thread"
    with Runtime(request.param, WORLD, launcher, timeout=30) as runtime:
        yield runtime


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_phase_steps(rt, case):
    run_regrouped(rt, case)


@pytest.mark.timeout(120)
def test_crossing_chain_relays_in_one_step(rt):
    run_crossing_chains(rt)


@pytest.mark.timeout(120)
def test_relay_only_receivers(rt):
    """A broadcast relayed through devices that hold no shard of the tensor (device 1
    on the root's host, device 5 on the last host): they pass the box on, keep
    nothing, and every destination shard is exact, also in a step shared with a
    plain broadcast."""
    src = Layout(DeviceMesh((1,), [0]), "RR")
    dst = Layout(DeviceMesh((2,), [4, 6]), "RR")
    value = np.arange(6 * 250_000, dtype=np.float32).reshape(6, -1)  # many chain pieces
    x = rt.put(value, src)
    plan = rt.plan(x, dst, "broadcast")
    tasks = []
    for t in plan.tasks:
        assert t.kind is TaskKind.BROADCAST
        tasks.append(dataclasses.replace(t, receivers=(1, 4, 5, 6), through=(1, 5)))
    relayed = ReshardPlan(plan.tensors, tuple(tasks), plan.strategy, plan.cluster)
    relayed.verify()
    assert {1, 5} <= set(relayed.devices)
    for _ in range(2):
        (y,) = rt.execute(relayed, [x])
        check_shards(rt, y, value)
        assert sorted(rt.shards(y)) == [4, 6]
        rt.free(y)
    rt.free(x)


@pytest.mark.timeout(120)
def test_phase_steps_on_fake_nccl():
    """The nccl backend's groups (several operations, widened int16 reduces wrapping
    back after the group) on the fake cupy, whose NCCL runs each operation at once."""
    with fake_nccl_runtime(WORLD) as runtime:
        for case in CASES:
            if case[0] in ("transpose", "partial-int16", "overlapping"):
                run_regrouped(runtime, case)


# ----- the gloo backend's groups, rank by rank -------------------------------------------
RANKS = (0, 1, 2)
BIG = 1 << 19  # float64 elements: 4 MiB, several chain pieces


class _Groups:
    """What GlooBackend.prepare reads from a plan."""

    def communicator_groups(self):
        return (RANKS,)


def _gloo_rank(device: int, address, results, done) -> None:
    import time
    import traceback

    from reshard.comm.backends.gloo import GlooBackend
    from reshard.errors import ExecutionError

    try:
        b = GlooBackend(device, RANKS, address.connect(10), 3.0)
        b.prepare(_Groups())
        out = {}
        # 0 and 1 exchange with opposite issue orders: one blocking operation at a time
        # would deadlock (each waits to receive first); a group runs both at once.
        if device in (0, 1):
            peer, mine = 1 - device, np.full(BIG, device, np.float64)
            got = np.zeros(BIG)
            b.group_start()
            if device == 0:
                b.recv(got, peer, tag=1)
                b.send(mine, peer, tag=2)
            else:
                b.recv(got, peer, tag=2)
                b.send(mine, peer, tag=1)
            b.group_end()
            out["swap"] = got
        # one group: crossing chains relayed by 2 (0 -> 2 -> 1, 1 -> 2 -> 0), a plain
        # send, an all-gather and a widened int16 reduce, all in flight at once
        c1 = np.arange(BIG, dtype=np.float64) if device == 0 else np.zeros(BIG)
        c2 = -np.arange(BIG, dtype=np.float64) if device == 1 else np.zeros(BIG)
        p2p = np.arange(5, dtype=np.int64) if device == 0 else np.zeros(5, np.int64)
        rows = np.zeros((3, 4), np.int32)
        red = np.full(6, 20000 + device, np.int16)  # the sum wraps in int16
        b.group_start()
        b.broadcast(c1, 0, RANKS, chain=(2, 1), tag=5)
        b.broadcast(c2, 1, RANKS, chain=(2, 0), tag=6)
        if device == 0:
            b.send(p2p, 1, tag=7)
        elif device == 1:
            b.recv(p2p, 0, tag=7)
        b.all_gather(rows, np.full(4, device * 10, np.int32), RANKS)
        b.reduce(red, 0, RANKS)
        b.group_end()
        out.update(c1=c1, c2=c2, p2p=p2p, rows=rows, red=red)
        # a relay whose pieces never come: an error within the timeout, not a hang
        if device == 2:
            t0 = time.monotonic()
            try:
                b.group_start()
                b.broadcast(np.zeros(BIG), 0, RANKS, chain=(2, 1), tag=8)
                b.broadcast(np.zeros(BIG), 0, RANKS, chain=(2, 1), tag=9)
                b.group_end()
            except ExecutionError as e:
                out["stuck"] = (str(e), time.monotonic() - t0)
        results.put((device, out))
        done.wait(30)
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((device, traceback.format_exc()))


@pytest.mark.timeout(90)
def test_gloo_group_runs_its_operations_at_once():
    got = rank_results(_gloo_rank, RANKS, wait=60)
    assert np.array_equal(got[0]["swap"], np.ones(BIG))
    assert np.array_equal(got[1]["swap"], np.zeros(BIG))
    total = np.full(6, 20000, np.int16)
    total += np.full(6, 20001, np.int16)
    total += np.full(6, 20002, np.int16)
    for d in RANKS:
        assert np.array_equal(got[d]["c1"], np.arange(BIG, dtype=np.float64)), d
        assert np.array_equal(got[d]["c2"], -np.arange(BIG, dtype=np.float64)), d
        assert np.array_equal(got[d]["rows"], np.repeat([[0], [10], [20]], 4, axis=1)), d
    assert np.array_equal(got[1]["p2p"], np.arange(5))
    assert got[0]["red"].tobytes() == total.tobytes()
    text, seconds = got[2]["stuck"]
    assert "device(s) [0]" in text and seconds < 3.0 + 2, (text, seconds)

"""The ``least-concurrent`` pass ruled out before its floor (issue 62, round nine,
:mod:`reshard.planner.passes.serial_floor`): "nothing to reorder" is exactly
``one_at_a_time`` giving the tasks back, a device's share is that device's sum in the
floor, a proof is given only where the floor would rule the pass out too, and the
search keeps the same plans with and without the proofs."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.builds import Builds
from reshard.planner.costing.casts import conversion_seconds
from reshard.planner.costing.cost import one_at_a_time_time
from reshard.planner.ir import ReshardPlan
from reshard.planner.passes import serial_floor, stages
from reshard.planner.passes.serial_floor import (
    MARGIN,
    busiest_devices,
    device_floor,
    serial_unchanged,
)
from reshard.planner.plan import _best_plan, planned_tensors
from reshard.planner.schedule.order import one_at_a_time
from reshard.planner.values.resources import capacities
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task, TaskKind

CLUSTER = Cluster.preset("dgx-h100", 8)
MESH = DeviceMesh((4, 8), range(32))
MOVES = [("RR", "RR", (2048, 2048)), ("S0R", "S0R", (2048, 2048)),
         ("RS1", "S0R", (2048, 2048)), ("S01R", "RS1", (2048, 2048)),
         ("S0S1", "RR", (1024, 1024)), ("RS0", "S1R", (4096, 1024)),
         ("RR+P0", "RS0", (4096, 1024)), ("S0R+P1", "RS0", (1024, 512)),
         ("RR+P01", "S1R", (2048, 256)), ("RS1+P0", "S0S1", (1000, 251)),
         ("S0R", "S01R", (1000, 251))]
"""Requests within one 4x8 mesh (float32); on the last, the pass is not ruled out (its
floor is kept; the cold set's RS1 -> RR was that case until round eleven's ``send_recv``
floor, passes/send_floor.py, changed what the search builds before the pass)."""


COLD = [("RS1", "RR", (8192, 8192)), ("RS10", "S0R", (2048, 2048)),
        ("S0R", "RS1", (2048, 2048)), ("RR+P0", "S0R", (2048, 2048))]
"""Requests of the 4x8 cold set (one mesh to another, bfloat16)."""


def _tensors(src: str, dst: str, shape: tuple[int, ...]):
    tensors, _ = planned_tensors(
        [(shape, "float32", Layout(MESH, src), Layout(MESH, dst))], CLUSTER, None, None)
    return tensors


def _cold(src: str, dst: str, shape: tuple[int, ...]):
    a, b = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))
    tensors, _ = planned_tensors(
        [(shape, "bfloat16", Layout(a, src), Layout(b, dst))], CLUSTER, None, None)
    return tensors


def _requests():
    return [_tensors(*m) for m in MOVES] + [_cold(*m) for m in COLD]


def _random_tasks(rng: random.Random) -> list[Task]:
    """Tasks over a few devices, each one step after its devices' last (so often
    unchanged by ``one_at_a_time``), then some nudged a step off or swapped."""
    last: dict[int, int] = {}
    tasks = []
    for _ in range(rng.randint(0, 14)):
        devices = rng.sample(range(6), rng.randint(1, 3))
        kind = rng.choice((TaskKind.SEND, TaskKind.BROADCAST, TaskKind.COPY))
        root = -1 if rng.random() < 0.1 else devices[0]
        step = 1 + max((last.get(d, -1) for d in devices), default=-1)
        task = Task(kind, 0, ((0, 8),), root, tuple(devices[1:]) or (devices[0],), 64,
                    step=step)
        for d in task.devices:
            last[d] = step
        tasks.append(task)
    tasks.sort(key=lambda t: t.step)
    if tasks and rng.random() < 0.5:
        i = rng.randrange(len(tasks))
        tasks[i] = tasks[i].at_step(tasks[i].step + rng.choice((-1, 1, 2)))
    if len(tasks) > 1 and rng.random() < 0.3:
        i = rng.randrange(len(tasks) - 1)
        tasks[i], tasks[i + 1] = tasks[i + 1], tasks[i]
    return tasks


def test_nothing_to_reorder_is_one_at_a_time_giving_the_tasks_back():
    rng = random.Random(5)
    seen = {True: 0, False: 0}
    for _ in range(3000):
        tasks = _random_tasks(rng)
        same = one_at_a_time(tasks) == tuple(tasks)
        assert serial_unchanged(tasks) == same, tasks
        seen[same] += 1
    for src, dst, shape in MOVES:
        for strat in Strategy:
            tasks = _best_plan(_tensors(src, dst, shape), CLUSTER, strat, Builds()).tasks
            same = one_at_a_time(tasks) == tasks
            assert serial_unchanged(tasks) == same
            seen[same] += 1
    assert min(seen.values()) > 100, seen


def _reference(plan: ReshardPlan) -> dict[int, float]:
    """Each device's tasks back to back (latency and bytes over the slowest resource
    of the route), no conversions: the floor's sums, device by device."""
    cap = capacities(plan.cluster)
    out: dict[int, float] = {}
    for t, (path, lat) in zip(plan.tasks, plan.routes()):
        slowest = max((f / cap[r[0]] for r, f in path if f > 0), default=0.0)
        for d in dict.fromkeys(t.devices):
            out[d] = out.get(d, 0.0) + lat + slowest * t.nbytes
    return out


@pytest.mark.parametrize("src,dst,shape", MOVES)
def test_a_devices_share_is_its_sum_in_the_floor(src, dst, shape):
    for strat in Strategy:
        plan = _best_plan(_tensors(src, dst, shape), CLUSTER, strat, Builds())
        floor = one_at_a_time_time(plan)
        ref = _reference(plan)
        assert not conversion_seconds(plan)  # no cast: the floor is the most of the sums
        assert max(ref.values()) == pytest.approx(floor, rel=1e-12)
        for d in set(ref) | {0, 31}:
            got = device_floor(plan, d)
            assert got <= floor
            assert got == pytest.approx(ref.get(d, 0.0) * (1 - MARGIN), rel=1e-12, abs=0.0)
        assert list(busiest_devices(plan.tasks))  # some device to try


class _Stub:
    """What :func:`device_floor` reads of a plan: its tasks, routes and cluster."""

    def __init__(self, tasks, paths, cluster) -> None:
        self.tasks, self._routes, self.cluster = tuple(tasks), paths, cluster

    def routes(self):
        return self._routes


def test_a_devices_share_counts_the_tasks_it_takes_part_in():
    """Sends, copies (a copy's devices are its receivers), tasks with no root and
    summing tasks (their addends take part), on short and long routes."""
    rng = random.Random(11)
    cap = capacities(CLUSTER)
    kinds = [k for k, c in cap.items() if c > 0]
    shared = [[((rng.choice(kinds), rng.randrange(8)), rng.choice((0.0, 0.25, 1.0)))
               for _ in range(rng.choice((1, 3, 60)))] for _ in range(6)]
    for _ in range(200):
        tasks, routes = [], []
        for _ in range(rng.randint(1, 12)):
            kind = rng.choice((TaskKind.SEND, TaskKind.COPY, TaskKind.REDUCE,
                               TaskKind.BROADCAST))
            devices = rng.sample(range(6), 4)
            root = -1 if rng.random() < 0.15 else devices[0]
            addends = tuple(devices[2:]) if kind is TaskKind.REDUCE else ()
            tasks.append(Task(kind, 0, ((0, 8),), root, (devices[1],), rng.randint(1, 1 << 20),
                              addends=addends))
            routes.append((rng.choice(shared), rng.choice((1e-6, 3e-6))))
        plan = _Stub(tasks, routes, CLUSTER)
        ref: dict[int, float] = {}
        for t, (path, lat) in zip(tasks, routes):
            slowest = max((f / cap[r[0]] for r, f in path if f > 0), default=0.0)
            for d in dict.fromkeys(t.devices):
                ref[d] = ref.get(d, 0.0) + lat + slowest * t.nbytes
        for d in range(6):
            assert device_floor(plan, d) == pytest.approx(  # type: ignore[arg-type]
                ref.get(d, 0.0) * (1 - MARGIN), rel=1e-12, abs=0.0)


def _recorded(monkeypatch) -> list[tuple[ReshardPlan, bool, Callable[[float], bool]]]:
    """Every ``ruled_out`` asked by the search: the start, the answer, and whether the
    pass's rule keeps a time (against the best so far and the bound)."""
    seen: list[tuple[ReshardPlan, bool, Callable[[float], bool]]] = []
    proof = serial_floor.serial_ruled_out

    def recorded(start, keeps):
        got = proof(start, keeps)
        seen.append((start, got, keeps))
        return got

    monkeypatch.setattr(stages, "serial_ruled_out", recorded)
    return seen


def test_a_proof_only_where_the_floor_rules_the_pass_out_too(monkeypatch):
    seen = _recorded(monkeypatch)
    for tensors in _requests():
        _best_plan(tensors, CLUSTER, Strategy.BROADCAST, Builds())
    assert any(not got and keeps(one_at_a_time_time(start)) for start, got, keeps in seen)
    proofs = [(start, keeps) for start, got, keeps in seen if got]
    kinds = set()
    for start, keeps in proofs:
        unchanged = one_at_a_time(start.tasks) == start.tasks
        kinds.add(unchanged)
        # no candidate, or the floor itself (found afresh) not kept either
        assert unchanged or not keeps(one_at_a_time_time(start))
    assert kinds == {True, False}  # both proofs were given


def test_the_search_keeps_the_same_plans_with_and_without_the_proofs(monkeypatch):
    seen = _recorded(monkeypatch)
    got = [_best_plan(t, CLUSTER, Strategy.BROADCAST, Builds()) for t in _requests()]
    assert any(answer for _, answer, _ in seen)
    monkeypatch.setattr(stages, "STAGES", tuple(
        tuple(stages.Pass(p.name, p.up_to, p.propose, p.keep, p.floor) for p in stage)
        for stage in stages.STAGES))  # no quicker proof: the floor alone
    monkeypatch.setattr(stages.search, "__defaults__",
                        (stages.STAGES, *stages.search.__defaults__[1:]))
    asked = len(seen)
    old = [_best_plan(t, CLUSTER, Strategy.BROADCAST, Builds()) for t in _requests()]
    assert len(seen) == asked  # the old path asked no proof
    for a, b in zip(got, old):
        assert a.tasks == b.tasks and a.estimate() == b.estimate()


def test_the_devices_tried_are_the_busiest_sender_then_receiver():
    def send(root: int, *receivers: int) -> Task:
        return Task(TaskKind.SEND, 0, ((0, 8),), root, receivers, 64)

    tasks = [send(-1, 9), send(2, 5), send(3, 5), send(3, 7), send(1, 5)]
    assert list(busiest_devices(tasks)) == [3, 5]
    assert list(busiest_devices([send(5, 5), send(5, 4)])) == [5]  # distinct
    assert list(busiest_devices([send(-1, 4), send(-1, 4)])) == [4]  # no root device

"""The ALLREDUCE task and the all-reduce-first candidate (reshard.planner.passes.allreduce).

Where a partial sum's meshes coincide, the default plan may all-reduce first; every
such plan is verified, costed as a ring, and moves the right bytes on the local
backend (which has an all-reduce) and through the fallback a backend without one runs
(a reduction into the first member, then a broadcast of the sum)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout, PlanError, plan
from reshard.comm.backend import Capabilities
from reshard.comm.backends.local import LocalBackend
from reshard.comm.engine.steps import program_steps
from reshard.comm.program import WorkerProgram
from reshard.planner.costing.cost import simulate
from reshard.planner.ir import ReshardPlan
from reshard.planner.passes.allreduce import allreduce_first, applies
from reshard.planner.plan import _best_plan
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task, TaskKind

from ..common import allreduce_first_moves, sample

ONE_HOST = Cluster.from_hosts([list(range(8))])
MESH = DeviceMesh((8,))
MESH2 = DeviceMesh((2, 4))

CASES = [  # (mesh, source spec, destination spec)
    (MESH, "RR+P0", "RR"),       # DTensor's Partial -> Replicate
    (MESH, "RR+P0", "S0R"),      # Partial -> Shard(0)
    (MESH2, "S1R+P0", "RS1"),    # (Partial, Shard(0)) -> (Replicate, Shard(1))
    (MESH2, "RR+P01", "S0R"),    # two partial axes
]


def _candidate(shape, dtype, mesh, s, d) -> tuple[ReshardPlan, ReshardPlan]:
    p = plan(shape, dtype, Layout(mesh, s), Layout(mesh, d), ONE_HOST)
    first = allreduce_first(p.tensors, ONE_HOST, Strategy.BROADCAST, _best_plan)
    assert first is not None
    return p, first


@pytest.mark.parametrize("mesh,s,d", CASES)
def test_candidate_verifies_and_costs_a_ring(mesh, s, d):
    _, first = _candidate((64, 32), "float32", mesh, s, d)
    first.verify()
    reduces = [t for t in first.tasks if t.kind is TaskKind.ALLREDUCE]
    groups = Layout(mesh, s).partial_groups()
    assert sorted(t.receivers for t in reduces) == sorted(tuple(sorted(g)) for g in groups)
    # the ring: each member sends and receives 2(k-1)/k of the box over its link
    ring = Task(TaskKind.ALLREDUCE, 0, ((0, 64), (0, 32)), -1, tuple(range(8)), 64 * 32 * 4)
    one = ReshardPlan(first.tensors[:1], (ring,), Strategy.BROADCAST, ONE_HOST)
    if s == "RR+P0":
        busy = simulate(one).time - ONE_HOST.intra_latency * 14
        assert busy == pytest.approx(64 * 32 * 4 * 2 * 7 / 8 / ONE_HOST.intra_bandwidth,
                                     rel=1e-6)


def test_partial_to_replicate_takes_the_all_reduce():
    """The model puts a ring all-reduce (1.75x the tensor per device) under a reduction
    then a broadcast (2x): the default plan is one ALLREDUCE, summed in place."""
    p = plan((2048, 2048), "float32", Layout(MESH, "RR+P0"), Layout(MESH, "RR"), ONE_HOST)
    assert [t.kind for t in p.tasks] == [TaskKind.ALLREDUCE]
    assert p.estimate() >= p.lower_bound()


def test_applies_only_where_meshes_coincide():
    other = DeviceMesh((4,), devices=range(8, 12))
    cl = Cluster.from_hosts([list(range(8)), list(range(8, 12))])
    t = plan((8, 8), "float32", Layout(MESH, "RR+P0"), Layout(other, "RR"), cl).tensors[0]
    assert not applies(t)
    assert allreduce_first((t,), cl, Strategy.BROADCAST, _best_plan) is None


def test_verify_refuses_a_wrong_allreduce():
    _, first = _candidate((16, 8), "float32", MESH, "RR+P0", "S0R")
    a = first.tasks[0]
    bad = {
        "not a whole group": dataclasses.replace(a, receivers=a.receivers[:-1]),
        "a root": dataclasses.replace(a, root=0, receivers=a.receivers[1:]),
        "one member": dataclasses.replace(a, receivers=a.receivers[:1]),
        "the wire's bytes": dataclasses.replace(a, nbytes=a.nbytes // 2),
    }
    for why, task in bad.items():
        broken = ReshardPlan(first.tensors, (task, *first.tasks[1:]), first.strategy,
                             first.cluster)
        with pytest.raises(PlanError):
            broken.verify()
        assert why
    twice = ReshardPlan(first.tensors, (a, dataclasses.replace(a, step=1),
                                        *[dataclasses.replace(t, step=2)
                                          for t in first.tasks[1:]]),
                        first.strategy, first.cluster)
    with pytest.raises(PlanError, match="already holds a reduced sum"):
        twice.verify()


def test_fallback_splits_into_reduce_then_broadcast():
    """A backend without an all-reduce runs each as a REDUCE into the first member and
    a broadcast of the sum, in two halves of the step."""
    _, first = _candidate((16, 8), "float32", MESH, "RR+P0", "S0R")
    prog = WorkerProgram.of(first, 3)
    native, _ = program_steps(prog, all_reduces=True)
    split, _ = program_steps(prog, all_reduces=False)
    assert [st.task.kind for st in native[0]] == [TaskKind.ALLREDUCE]
    assert [st.task.kind for st in split[0]] == [TaskKind.REDUCE]
    assert [(st.task.kind, st.task.root) for st in split[1]] == [(TaskKind.ALLREDUCE, 0)]


@pytest.mark.parametrize("native", [True, False], ids=["all_reduce", "fallback"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int16"])
@pytest.mark.parametrize("mesh,s,d", CASES)
def test_bytes_on_the_local_backend(mesh, s, d, dtype, native, monkeypatch):
    """Every shard byte for byte (the local backend's all-reduce; or, as a backend
    without one, the reduction and broadcast, its all_reduce then never called)."""
    rng = np.random.default_rng(5)
    value = sample(rng, (13, 6), dtype)
    src, dst = Layout(mesh, s), Layout(mesh, d)
    if not native:
        monkeypatch.setattr(LocalBackend, "capabilities", dataclasses.replace(
            LocalBackend.capabilities, all_reduces=False))
        monkeypatch.setattr(LocalBackend, "all_reduce", None)
    calls: list[str] = []
    for name in ("all_reduce", "reduce", "broadcast"):
        method = getattr(LocalBackend, name)
        if method is not None:
            monkeypatch.setattr(LocalBackend, name, _counted(method, name, calls))
    with reshard.Runtime(backend="local", cluster=ONE_HOST) as rt:
        x, _ = allreduce_first_moves(rt, value, src, dst, rng)
        again = rt.get(x)  # the caller's addends untouched: the sum again
        assert again.tobytes() == value.tobytes()
    ran = set(calls)
    assert ran == ({"all_reduce"} if native else {"reduce", "broadcast"}), ran


def _counted(method, name: str, calls: list[str]):
    def counted(self, *args, **kwargs):
        calls.append(name)
        return method(self, *args, **kwargs)
    return counted


def test_capabilities_meet_keeps_all_reduce_only_if_both():
    a = Capabilities(None, None, False, "cpu", all_reduces=True)
    b = dataclasses.replace(a, all_reduces=False)
    assert a.meet(a).all_reduces and not a.meet(b).all_reduces and not b.meet(a).all_reduces

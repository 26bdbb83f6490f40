"""The CPU data planes (gloo, tcp, nixl) on real worker processes, with both launchers: every
destination shard exact for every strategy, on the paper's cases and on random layouts.

One runtime (eight workers) per backend and launcher serves the whole module.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from reshard import DeviceMesh, ExecutionError, Layout, ReshardError, ShapeError
from reshard.runtime import Runtime

from ._helpers import (
    STRATEGIES,
    WORLD,
    addends,
    check_paper_case,
    check_random_problem,
    check_shards,
    paper_cases,
    problem_settings,
    problems,
    sample,
    thread_policies,
)

pytestmark = pytest.mark.cpu

CASES = paper_cases()


@pytest.fixture(scope="module", params=[("gloo", "process"), ("gloo", "ray"),
                                        ("tcp", "process"), ("tcp", "ray"),
                                        ("nixl", "process"), ("nixl", "ray")],
                ids=["gloo-process", "gloo-ray", "tcp-process", "tcp-ray", "nixl-process",
                     "nixl-ray"])
def rt(request):
    backend, launcher = request.param
    if backend == "nixl":
        pytest.importorskip("nixl", reason="the nixl extra is not installed")
    if launcher == "ray":
        request.getfixturevalue("ray_session")
    with Runtime(backend, WORLD, launcher, timeout=30) as runtime:
        yield runtime


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", CASES, ids=[f"case{c.name}" for c in CASES])
def test_paper_case(rt, case):
    check_paper_case(rt, case)


@pytest.mark.timeout(240)
@problem_settings(max_examples=25)
@given(problem=problems())
def test_random_layouts(rt, problem):
    check_random_problem(rt, problem)


@pytest.mark.timeout(120)
def test_many_tensors_one_plan(rt):
    """reshard_many: two tensors, one plan, partial source reduced on the way."""
    rng = np.random.default_rng(7)
    a, b = sample(rng, (9, 6), "float32"), sample(rng, (5, 7, 3), "int64")
    mesh_a, mesh_b = DeviceMesh((2, 2), [0, 1, 2, 3]), DeviceMesh((2, 2), [4, 5, 6, 7])
    src_a, dst_a = Layout(mesh_a, "S0R+P1"), Layout(mesh_b, "RS10")
    src_b, dst_b = Layout(mesh_b, "RS0R"), Layout(DeviceMesh((4,), [1, 3, 5, 7]), "S0RR")
    xa = rt.put_shards(addends(rng, a, src_a), src_a, a.shape, a.dtype)
    xb = rt.put(b, src_b)
    for strategy in STRATEGIES:
        ya, yb = rt.reshard_many([xa, xb], [dst_a, dst_b], strategy)
        check_shards(rt, ya, a)
        check_shards(rt, yb, b)
        assert np.array_equal(rt.get(yb), b)
        rt.free(ya, yb)


class _Spy:
    """Counts calls the driver sends to workers."""

    def __init__(self, group):
        self.group, self.calls = group, []

    def __call__(self, device, call):
        self.calls.append((device, type(call).__name__))
        return self.group.__class__.submit(self.group, device, call)


@pytest.mark.timeout(120)
def test_bad_input_refused_before_sending(rt, monkeypatch):
    spy = _Spy(rt.group)
    monkeypatch.setattr(rt.group, "submit", spy)
    src = Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "S0R")
    dst = Layout(DeviceMesh((2, 2), [4, 5, 6, 7]), "RS1")
    good = np.arange(24, dtype=np.float32).reshape(4, 6)
    boxes = src.boxes(good.shape)
    shards = {d: good[tuple(slice(a, b) for a, b in box)].copy() for d, box in boxes.items()}

    with pytest.raises(ShapeError):  # one shard of the wrong shape
        rt.put_shards({**shards, 2: np.zeros((1, 6), np.float32)}, src, good.shape, "float32")
    with pytest.raises(ShapeError):  # one shard of the wrong dtype
        rt.put_shards({**shards, 0: shards[0].astype(np.float64)}, src, good.shape, "float32")
    with pytest.raises(ShapeError):  # a device missing
        rt.put_shards({d: s for d, s in shards.items() if d != 3}, src, good.shape, "float32")
    with pytest.raises(ReshardError):  # rank does not fit the spec
        rt.put(np.zeros((4, 6, 2), np.float32), Layout(src.mesh, "S0RRR"))
    assert spy.calls == []

    x = rt.put(good, src)
    plan = rt.plan(x, dst, "broadcast")
    other = rt.put(good.astype(np.int32), src)
    spy.calls.clear()
    with pytest.raises(ShapeError):  # the plan was made for float32
        rt.execute(plan, [other])
    assert spy.calls == []

    (y,) = rt.execute(plan, [x])  # the runtime still works
    check_shards(rt, y, good)
    rt.free(x, y, other)


@pytest.mark.timeout(60)
def test_unknown_device_refused(rt):
    with pytest.raises(ReshardError):
        rt.put(np.zeros(4), Layout(DeviceMesh((2,), [0, 99]), "S0"))


@pytest.mark.timeout(60)
def test_load_reaches_every_worker(rt):
    """gloo makes sub-groups with every rank: plans load on the whole world; tcp
    connects pairs on first use: only on a plan's devices."""
    assert rt.capabilities.groups_need_world is (rt.backend.value == "gloo")
    assert rt.group.devices == WORLD.devices
    assert not rt.group.dead()


@pytest.mark.timeout(10)
def test_a_failure_and_a_bad_input_are_different_categories():
    """A dead worker is not the caller's mistake: ExecutionError is a RuntimeError, not a
    ValueError; one base class catches both."""
    from reshard import ReshardBaseError

    assert issubclass(ExecutionError, RuntimeError) and not issubclass(ExecutionError, ValueError)
    assert not issubclass(ExecutionError, ReshardError) and issubclass(ShapeError, ValueError)
    assert issubclass(ExecutionError, ReshardBaseError) and issubclass(ReshardError, ReshardBaseError)


@pytest.mark.timeout(60)
def test_workers_run_under_batch_scheduling(rt):
    """gloo, tcp and nixl ask for SCHED_BATCH (reshard.comm.launchers.scheduling): every
    thread of every worker, process or Ray actor, gloo's progress thread included, runs
    under it."""
    pids = rt.group.pids
    assert sorted(pids) == sorted(rt.group.devices)
    for device, pid in pids.items():
        policies = thread_policies(pid)
        if rt.backend.value == "gloo":
            assert "gloo_tcp_loop" in {name for name, _ in policies}, device
        wrong = {k: v for k, v in policies.items() if v != "batch"}
        assert not wrong, f"device {device}: {wrong}"

"""A simulation told to stop, stopped before its step rule is built where it would
stop at its first event (:func:`reshard.planner.costing.fluid._stops_at_once`): the
same answer as the run it skips, which the tests run in full (the simulation as it
was: its state, step rule and clock bound, with no check ahead)."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.costing import fluid
from reshard.planner.costing.fairshare import FairShare
from reshard.planner.costing.fluid import STOP_MARGIN, _carried, _Fluid, _stops_at_once, simulate
from reshard.planner.costing.stepgate import gate_of
from reshard.planner.ir import ReshardPlan
from reshard.planner.values.tasks import TaskKind

CL = Cluster.preset("dgx-h100", 2)
MESH = DeviceMesh((2, 8), range(16))
LOW = DeviceMesh((2, 4), range(8))  # overlaps MESH's first host
CASES = [((1 << 22,), MESH, "R+P01", MESH, "R", None),  # partial sums
         ((1 << 20,), MESH, "R+P0", MESH, "R", None),
         ((510, 4093), MESH, "S0R", MESH, "RS1", None),  # uneven
         ((256, 2048), MESH, "S0R+P1", MESH, "RS0", None),
         ((1 << 21,), MESH, "S0", MESH, "R", "allgather"),
         ((1000, 998), LOW, "S01R", MESH, "RS1", None),  # overlapping meshes
         ((4096, 2048), MESH, "RS1", LOW, "S0R", "send_recv")]


@functools.cache
def _plans() -> tuple[ReshardPlan, ...]:
    return tuple(reshard.plan(shape, "bfloat16", Layout(a, s), Layout(b, d), cluster=CL,
                              **({} if strat is None else {"strategy": strat}))
                 for shape, a, s, b, d, strat in CASES)


def _fresh(plan: ReshardPlan) -> ReshardPlan:
    return ReshardPlan(plan.tensors, plan.tasks, plan.strategy, plan.cluster)


def _reference(plan: ReshardPlan, stop):
    """The simulation with no check ahead: its state and step rule built, then run."""
    flows = FairShare([path for path, _ in plan.routes()], plan.cluster)
    nbytes = np.array([float(t.nbytes) for t in plan.tasks])
    return _Fluid(flows, nbytes, gate_of(plan.tasks), plan.latencies()).run(stop)


def _first_ask(plan: ReshardPlan) -> float:
    """The time the full run first asks ``stop`` about (its first event's bound)."""
    asked: list[float] = []
    _reference(plan, lambda t: asked.append(t) or True)
    return asked[0]


def _thresholds(first: float, full: float) -> list[float]:
    near = [first * (1 + d) for d in (-1e-5, -2e-6, -1e-6, -1e-7, 0.0, 1e-7, 1e-6, 1e-5)]
    return [*near, np.nextafter(first, 0.0), np.nextafter(first, np.inf),
            first * (1 + STOP_MARGIN), first * (1 + STOP_MARGIN / 2), first * 0.5,
            full * 0.999, full, full * 1.001, full * 2.0]


@pytest.mark.parametrize("plan", _plans(), ids=[f"{c[2]}->{c[4]}" for c in CASES])
def test_a_stop_at_once_answers_as_the_full_run(plan):
    full = _reference(plan, None)
    assert simulate(_fresh(plan)) == full
    first = _first_ask(plan)
    for x in _thresholds(first, full.time):
        def stop(t, x=x):
            return t >= x
        want = _reference(plan, stop)
        assert simulate(_fresh(plan), stop) == want
        assert (simulate(_fresh(plan), stop) is None) == (want is None)


def _at_once(plan: ReshardPlan, stop) -> bool:
    flows = FairShare([path for path, _ in plan.routes()], plan.cluster)
    nbytes = np.array([float(t.nbytes) for t in plan.tasks])
    return _stops_at_once(plan.tasks, _carried(flows, nbytes), flows.capacity,
                          plan.latencies(), stop)


@pytest.mark.parametrize("plan", _plans(), ids=[f"{c[2]}->{c[4]}" for c in CASES])
def test_the_check_ahead_asks_what_the_first_event_asks(plan):
    """The check ahead stops only runs that stop at their first event; where a task
    of least latency starts at once, every one of them."""
    lat = plan.latencies()
    exact = bool((lat[gate_of(plan.tasks).start()] == lat.min()).any())
    first = _first_ask(plan)
    stopped = ahead = 0
    for x in _thresholds(first, _reference(plan, None).time):
        def stop(t, x=x):
            return t >= x
        got = _at_once(plan, stop)
        assert got <= stop(first)
        if exact:
            assert got == stop(first)
        stopped += stop(first)
        ahead += got
    assert 0 < stopped < len(_thresholds(first, 1.0))
    assert ahead > 0 or not exact


def test_most_cases_start_a_task_of_least_latency_at_once():
    starts = [bool((p.latencies()[gate_of(p.tasks).start()] == p.latencies().min()).any())
              for p in _plans()]
    assert sum(starts) >= 3


def test_some_first_events_differ_in_latency():
    """The cases start tasks of several latencies at once (the least one decides)."""
    spread = [len(set(p.latencies()[gate_of(p.tasks).start()].tolist())) for p in _plans()]
    assert max(spread) > 1


def _stub(receivers, root=-1, kind=TaskKind.BROADCAST):
    return SimpleNamespace(receivers=receivers, root=root, kind=kind)


def test_no_check_ahead_where_the_run_could_stall_or_has_no_event():
    carried, cap = np.array([8.0, 4.0]), np.array([2.0, 0.0])
    always = lambda t: True
    one = [_stub((1,))]
    assert _stops_at_once(one, carried, cap, np.array([1e-6]), always)
    # no task with a device: the step rule starts none, and the run stalls (raises)
    assert not _stops_at_once([_stub(()), _stub((), 3, TaskKind.COPY)], carried, cap,
                              np.array([0.0, 0.0]), always)
    assert _stops_at_once([_stub(()), _stub((), 3)], carried, cap, np.array([0.0, 0.0]),
                          always)  # a root that is no copy's is a device
    # a latency not finite: the run's first event may never come
    assert not _stops_at_once(one, carried, cap, np.array([np.inf]), always)
    assert not _stops_at_once(one, carried, cap, np.array([np.nan]), always)
    assert not _stops_at_once([], carried[:0], cap[:0], np.zeros(0), always)


def test_the_first_bound_is_the_least_latency_plus_the_busiest_resource():
    carried, cap = np.array([8.0, 9.0, 3.0]), np.array([2.0, 0.0, 1.0])
    lat = np.array([3.0, 1.0, 2.0])
    tasks = [_stub((1,))] * 3
    bound = (1.0 + 4.0) / (1 + STOP_MARGIN)  # 8 / 2 beats 3 / 1; no capacity: no time
    assert _stops_at_once(tasks, carried, cap, lat, lambda t: t >= bound)
    assert not _stops_at_once(tasks, carried, cap, lat,
                              lambda t: t >= np.nextafter(bound, np.inf))


def test_a_stalled_plan_still_raises():
    plan = _plans()[0]
    lat = np.full(len(plan.tasks), np.inf)
    flows = FairShare([path for path, _ in plan.routes()], plan.cluster)
    nbytes = np.array([float(t.nbytes) for t in plan.tasks])
    assert not _stops_at_once(plan.tasks, _carried(flows, nbytes), flows.capacity, lat,
                              lambda t: True)
    with pytest.raises(RuntimeError, match="stalled"):
        fluid._Fluid(flows, nbytes, gate_of(plan.tasks), lat).run(lambda t: True)

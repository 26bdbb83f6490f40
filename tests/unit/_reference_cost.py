"""The cost model's fluid simulation as first written (every event refills every
flowing task from scratch): the oracle that planner/costing/cost.py's incremental simulation
(planner/costing/fairshare.py) is checked against. Tests only; slow on large plans."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.costing.cost import Estimate, task_path
from reshard.planner.values.resources import Resource
from reshard.planner.values.resources import capacity as _capacity

if TYPE_CHECKING:
    from reshard.planner.ir import ReshardPlan


class _Flows:
    """Tasks x resources incidence, and max-min fair rates by progressive filling."""

    def __init__(self, paths: list[list[tuple[Resource, float]]], cluster: Cluster) -> None:
        index: dict[Resource, int] = {}
        task, res, frac = [], [], []
        for t, p in enumerate(paths):
            for r, f in p:
                if f > 0:
                    task.append(t)
                    res.append(index.setdefault(r, len(index)))
                    frac.append(f)
        self.resources = list(index)
        self.capacity = np.array([_capacity(r, cluster) for r in self.resources])
        self.task = np.array(task, dtype=np.int64)
        self.res = np.array(res, dtype=np.int64)
        self.frac = np.array(frac, dtype=np.float64)
        self.n = len(paths)

    def rates(self, flowing: np.ndarray) -> np.ndarray:
        """Rates (bytes/s) of the tasks flagged in ``flowing`` (inf if they use no
        bandwidth-limited resource); 0 elsewhere."""
        rate = np.where(flowing, np.inf, 0.0)
        sel = flowing[self.task]
        t, r, f = self.task[sel], self.res[sel], self.frac[sel]
        left = self.capacity.copy()
        nres = len(left)
        active = flowing.copy()
        while len(t):
            act = active[t]
            if not act.any():
                break
            demand = np.bincount(r[act], weights=f[act], minlength=nres)
            with np.errstate(divide="ignore", invalid="ignore"):
                level = np.where(demand > 0, left / np.where(demand > 0, demand, 1), np.inf)
            low = level.min()
            if not np.isfinite(low):
                break
            tight = level <= low * (1 + 1e-9)
            hit = act & tight[r]
            frozen = np.zeros(self.n, dtype=bool)
            frozen[t[hit]] = True
            rate[frozen] = low
            active &= ~frozen
            used = frozen[t]
            left = np.maximum(0.0, left - np.bincount(r[used], weights=f[used] * low,
                                                      minlength=nres))
            keep = ~used
            t, r, f = t[keep], r[keep], f[keep]
        return rate


def _routes(tasks, cluster):
    """Each task's path and latency (:func:`task_path`, one task at a time), and the
    bytes every resource carries in all."""
    paths, lats = [], []
    carried: dict[Resource, float] = {}
    for t in tasks:
        p, lat = task_path(t, cluster)
        paths.append(p)
        lats.append(lat)
        for r, f in p:
            carried[r] = carried.get(r, 0.0) + f * t.nbytes
    return paths, lats, carried


class _Steps:
    """The step rule, one task at a time in plain Python (independent of the library's
    array bookkeeping, :mod:`reshard.planner.costing.stepgate`): a device enters its
    next step when its tasks of this one ended; a task starts when all its devices
    entered its step."""

    def __init__(self, tasks) -> None:
        self.tasks = tasks
        self.steps_of: dict[int, list[int]] = {}  # per device: its steps in order
        self.members: dict[tuple[int, int], list[int]] = {}  # per (device, step): tasks
        self.devs_of = [tuple(set(t.devices)) for t in tasks]
        for i, t in enumerate(tasks):
            for d in self.devs_of[i]:
                lst = self.members.setdefault((d, t.step), [])
                if not lst:
                    self.steps_of.setdefault(d, []).append(t.step)
                lst.append(i)
        for steps in self.steps_of.values():
            steps.sort()
        self.at = {d: 0 for d in self.steps_of}  # index into steps_of[d] of d's step
        self.left = {key: len(v) for key, v in self.members.items()}
        self.arrived = [0] * len(tasks)

    def _enter(self, d: int) -> list[int]:
        ready = []
        for i in self.members[(d, self.steps_of[d][self.at[d]])]:
            self.arrived[i] += 1
            if self.arrived[i] == len(self.devs_of[i]):
                ready.append(i)
        return ready

    def start(self) -> list[int]:
        """The tasks that start at once."""
        return [i for d in self.steps_of for i in self._enter(d)]

    def ended(self, i: int) -> list[int]:
        """The tasks that start once task ``i`` ended."""
        ready = []
        step = self.tasks[i].step
        for d in self.devs_of[i]:
            key = (d, step)
            self.left[key] -= 1
            if self.left[key] == 0 and self.at[d] + 1 < len(self.steps_of[d]):
                self.at[d] += 1
                ready += self._enter(d)
        return ready


def reference_simulate(plan: ReshardPlan) -> Estimate:
    """The fluid simulation of ``plan`` (steps by :class:`_Steps`): a started task waits
    its latency, then moves its bytes at its max-min fair share of every resource on its
    path, shares recomputed whenever a task starts or ends."""
    cluster = plan.cluster
    tasks = plan.tasks
    n = len(tasks)
    paths, lats, carried = _routes(tasks, cluster)
    flows = _Flows(paths, cluster)
    steps = _Steps(tasks)
    starts = np.zeros(n)
    ends = np.zeros(n)
    remaining = np.array([float(t.nbytes) for t in tasks])
    lat_arr = np.array(lats, dtype=np.float64)
    flow_at = np.full(n, np.inf)  # time a started task's bytes begin to flow
    flowing = np.zeros(n, dtype=bool)
    now = 0.0

    def start(ready: list[int]) -> None:
        starts[ready], flow_at[ready] = now, now + lat_arr[ready]

    start(steps.start())
    finished_count = 0
    rate = np.zeros(n)
    dirty = True
    while finished_count < n:
        if dirty:
            rate = flows.rates(flowing)
            dirty = False
        with np.errstate(divide="ignore", invalid="ignore"):
            fin = np.where(flowing, now + np.where(rate > 0, remaining / rate, np.inf), np.inf)
        nxt = min(float(fin.min()) if n else np.inf, float(flow_at.min()) if n else np.inf)
        if nxt == np.inf:
            raise RuntimeError("cost simulation stalled; the plan's order is inconsistent")
        dt = nxt - now
        now = nxt
        moved = np.where(np.isinf(rate), remaining, rate * dt)
        remaining = np.where(flowing, np.maximum(0.0, remaining - moved), remaining)
        ending = flowing & ((fin <= now * (1 + 1e-12))
                            | (remaining <= 1e-9 * np.maximum(1.0, remaining + moved)))
        starting = flow_at <= now
        if starting.any():
            flow_at[starting] = np.inf
            zero = starting & (remaining <= 0)
            ending |= zero
            flowing |= starting & ~zero
            dirty = True
        if not ending.any():
            continue
        flowing &= ~ending
        dirty = True
        for i in np.flatnonzero(ending).tolist():
            ends[i] = now
            finished_count += 1
            start(steps.ended(i))
    busiest = max(carried.items(), key=lambda kv: kv[1], default=(("none", -1), 0.0))
    return Estimate(float(ends.max()) if n else 0.0, tuple(starts.tolist()),
                    tuple(ends.tolist()), (busiest[0][0], busiest[0][1], busiest[1]))

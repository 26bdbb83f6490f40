"""The simulation's loads summed only where they are read again (issue 62 round ten):
a refill whose changed tasks had no rate adds their new load alone (the old one is 0.0
on every resource), and the event that ends every task left sums no load off. Every
start, end and time equals, bit for bit, the run that sums both every time (the
``_end`` and ``_refill`` these replace, kept here), on random flows: one step and
several, small and larger plans (refills deferred), fractions of 1 and others, tasks
of no bytes or no resource."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard import Cluster
from reshard.planner.costing import fluid
from reshard.planner.costing.fairshare import FairShare
from reshard.planner.costing.stepgate import OneStep, StepGate


class _Before(fluid._Fluid):
    """The run as before round ten: every end's load summed, both loads a refill."""

    def _end(self, ending, last=False):  # type: ignore[no-untyped-def]
        self.flowing[ending] = False
        self.fin[ending] = np.inf
        self.low = min(self.low, float(self.rate[ending].min()))
        off = self.flows.load(ending, self.rate)
        self.freed += off
        self.usage -= off
        refill = False
        full = np.isfinite(self.share.level)
        if (self.freed[full] > 0).any():
            if self.window is None:
                refill = True
            else:
                self.refill_at = min(self.refill_at, self.now + self.window)
        self.rate[ending] = 0.0
        return refill

    def _refill(self):  # type: ignore[no-untyped-def]
        self.share = self.flows.fill(self.flowing, None if self.started else self.share,
                                     self.low, self.usage)
        self.started = False
        new = self.share.rate
        changed = np.flatnonzero(self.flowing & (new != self.rate))
        self.low = np.inf
        self.freed[:] = 0.0
        self.refill_at = np.inf
        if not len(changed):
            return
        on, off = self.flows.loads(changed, new, self.rate)
        self.usage += on - off
        now, remaining = self.now, self.remaining
        old = self.rate[changed]
        moved = np.where(np.isinf(old), remaining[changed], old * (now - self.since[changed]))
        remaining[changed] = np.where(old > 0, np.maximum(0.0, remaining[changed] - moved),
                                      remaining[changed])
        self.since[changed] = now
        r = new[changed]
        self.rate[changed] = r
        with np.errstate(divide="ignore"):
            self.fin[changed] = now + np.where(np.isinf(r), 0.0, remaining[changed] / r)


def _gate(rng: random.Random, n: int, steps: int, devices: int):
    """The step rule: one step (every task at once) or several, each task on a few of
    ``devices``."""
    if steps == 1:
        return lambda: OneStep(n)
    need = np.array([rng.randint(1, 3) for _ in range(n)], dtype=np.int64)
    member = np.array([d for k in need.tolist() for d in rng.sample(range(devices), k)],
                      dtype=np.int64)
    step = np.array(sorted(rng.randrange(steps) for _ in range(n)), dtype=np.int64)
    return lambda: StepGate.of_members(need, member, step)


@pytest.mark.parametrize("seed", range(16))
def test_the_loads_summed_where_read_give_the_same_run(seed, monkeypatch):
    rng = random.Random(seed)
    cluster = Cluster.preset("dgx-h100", 4)
    n = rng.choice([3, 40, 300]) if seed % 4 else 5000
    if n > fluid.EXACT_UP_TO or seed % 3 == 0:
        monkeypatch.setattr(fluid, "EXACT_UP_TO", min(fluid.EXACT_UP_TO, n - 1))
    nres = rng.choice([4, 30, 200])
    lens = np.array([rng.choice([0, 1, 2, 4, 6]) if seed % 5 == 0 else rng.randint(1, 6)
                     for _ in range(n)], dtype=np.int64)
    codes = np.array([rng.randrange(nres) * 8 + rng.randrange(4) for _ in range(lens.sum())],
                     dtype=np.int64)
    whole = seed % 2 == 0
    frac = np.ones(len(codes)) if whole else \
        np.array([rng.choice([1.0, 0.5, 0.875, 0.0]) for _ in codes])
    nbytes = np.array([float(rng.choice([0, 1 << 10, 3 << 20, 1 << 24, 12345]))
                       for _ in range(n)])
    lat = np.array([rng.choice([0.0, 2e-6, 1.1e-5]) for _ in range(n)])
    gate = _gate(rng, n, rng.choice([1, 1, 3, 8]), 32)
    runs = []
    for kind in (fluid._Fluid, _Before):
        flows = FairShare.of_edges(codes, frac, lens, cluster)
        runs.append(kind(flows, nbytes, gate(), lat).run())
    got, want = runs
    assert got is not None and want is not None
    assert got.time == want.time
    assert got.starts == want.starts  # the same floats, task by task
    assert got.ends == want.ends
    assert got.busiest == want.busiest


@pytest.mark.parametrize("seed", range(6))
def test_a_value_per_edge_by_repeat_is_the_gather(seed):
    """``FairShare.per_edge`` (each transfer's value repeated over its edges) is
    ``values[task]``: transfers of no edge, edges of fraction 0 left out."""
    rng = random.Random(seed)
    cluster = Cluster.preset("dgx-h100", 4)
    n = rng.choice([1, 7, 200])
    lens = np.array([rng.choice([0, 1, 3, 5]) for _ in range(n)], dtype=np.int64)
    codes = np.array([rng.randrange(40) * 8 + rng.randrange(4) for _ in range(lens.sum())],
                     dtype=np.int64)
    frac = np.array([rng.choice([1.0, 0.0, 0.5]) if seed % 2 else 1.0 for _ in codes])
    flows = FairShare.of_edges(codes, frac, lens, cluster)
    values = np.array([rng.random() for _ in range(n)])
    got = flows.per_edge(values)
    assert got.tolist() == values[flows.task].tolist()


@pytest.mark.parametrize("seed", range(6))
def test_the_time_alone_is_the_estimate_s_time(seed):
    """``simulated_time`` (the run without each task's start and end as Python floats)
    is ``simulate_arrays(...).time``, the same float."""
    rng = random.Random(seed)
    cluster = Cluster.preset("dgx-h100", 4)
    n = rng.choice([1, 30, 400])
    lens = np.array([rng.randint(1, 5) for _ in range(n)], dtype=np.int64)
    codes = np.array([rng.randrange(50) * 8 + rng.randrange(4) for _ in range(lens.sum())],
                     dtype=np.int64)
    frac = np.ones(len(codes))
    nbytes = np.array([float(rng.choice([0, 1 << 20, 12345])) for _ in range(n)])
    lat = np.array([rng.choice([0.0, 2e-6]) for _ in range(n)])
    gate = _gate(rng, n, rng.choice([1, 4]), 16)
    want = fluid.simulate_arrays(FairShare.of_edges(codes, frac, lens, cluster), nbytes,
                                 gate(), lat).time
    got = fluid.simulated_time(FairShare.of_edges(codes, frac, lens, cluster), nbytes,
                               gate(), lat)
    assert got == want

"""Issue 62 round thirteen, each fast path against the code it replaces (kept here or
in the module as the oracle), bit for bit:

* the run reads and writes its per-task arrays through a slice where the tasks that
  start, end or change rate are every task (``fluid._at``), not through their indices;
* ``first_seen.numbered`` numbers a prefix of many codes first and looks the rest up
  (``_numbered_all``, the numbering before, and a plain dict are the oracles).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard import Cluster
from reshard.planner.costing import first_seen, fluid
from reshard.planner.costing.fairshare import FairShare
from reshard.planner.costing.stepgate import OneStep, StepGate
from reshard.planner.values.resources import KIND_CODE


class _Indexed(fluid._Fluid):
    """The run as before: every start, end and refill through the tasks' indices."""

    def _enter(self, ready):  # type: ignore[no-untyped-def]
        self.starts[ready] = self.now
        self.flow_at[ready] = self.now + self.lat[ready]

    def _start_flows(self, ending):  # type: ignore[no-untyped-def]
        refill = self.now >= self.refill_at
        starting = (self.flow_at <= self.now).nonzero()[0]
        if len(starting):
            self.flow_at[starting] = np.inf
            empty = self.remaining[starting] <= 0
            ending = fluid._union(ending, starting[empty])
            self.flowing[starting[~empty]] = True
            self.started = True
            if self.window is None:
                refill = True
            else:
                self.refill_at = min(self.refill_at,
                                     self.now + self.window * fluid.START_SHARE)
        return ending, refill

    def _end(self, ending, last=False):  # type: ignore[no-untyped-def]
        self.flowing[ending] = False
        self.fin[ending] = np.inf
        self.low = min(self.low, float(self.rate[ending].min()))
        if last:
            self.rate[ending] = 0.0
            return False
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
        changed = (self.flowing & (new != self.rate)).nonzero()[0]
        self.low = np.inf
        self.freed[:] = 0.0
        self.refill_at = np.inf
        if not len(changed):
            return
        old = self.rate[changed]
        if old.any():
            on, off = self.flows.loads(changed, new, self.rate)
            self.usage += on - off
        else:
            self.usage += self.flows.load(changed, new)
        now, remaining = self.now, self.remaining
        if old.any():
            moved = np.where(np.isinf(old), remaining[changed],
                             old * (now - self.since[changed]))
            remaining[changed] = np.where(old > 0, np.maximum(0.0, remaining[changed] - moved),
                                          remaining[changed])
        self.since[changed] = now
        r = new[changed]
        self.rate[changed] = r
        with np.errstate(divide="ignore"):
            self.fin[changed] = now + np.where(np.isinf(r), 0.0, remaining[changed] / r)


def _flows(rng: random.Random, seed: int):  # type: ignore[no-untyped-def]
    """Transfers' edges: an all-to-all (every resource fills at once, equal bytes end
    together) or random paths (some of no edge), fractions of 1 or others."""
    if seed % 3 == 0:
        devices = rng.choice([3, 6, 12])
        pairs = [(a, b) for a in range(devices) for b in range(devices) if a != b]
        codes = [c for a, b in pairs for c in (a * 8 + KIND_CODE["dev_out"],
                                               b * 8 + KIND_CODE["dev_in"])]
        lens = [2] * len(pairs)
    else:
        n, nres = rng.choice([4, 50, 400]), rng.choice([2, 5, 40])
        lens = [rng.choice([0, 1, 3]) if seed % 5 == 1 else rng.randint(1, 5) for _ in range(n)]
        codes = [rng.randrange(nres) * 8 + rng.randrange(4) for _ in range(sum(lens))]
    frac = [1.0] * len(codes) if seed % 2 == 0 else \
        [rng.choice([1.0, 0.5, 0.375, 0.0]) for _ in codes]
    return (np.array(codes, dtype=np.int64), np.array(frac), np.array(lens, dtype=np.int64))


def _gate(rng: random.Random, n: int, seed: int):  # type: ignore[no-untyped-def]
    if seed % 4 != 2:
        return lambda: OneStep(n)
    need = np.array([rng.randint(1, 2) for _ in range(n)], dtype=np.int64)
    member = np.array([d for k in need.tolist() for d in rng.sample(range(16), k)],
                      dtype=np.int64)
    step = np.array(sorted(rng.randrange(3) for _ in range(n)), dtype=np.int64)
    return lambda: StepGate.of_members(need, member, step)


@pytest.mark.parametrize("seed", range(24))
def test_the_run_through_views_is_the_run_through_indices(seed, monkeypatch):
    rng = random.Random(seed)
    if seed % 6 == 5:  # refills deferred, as in larger plans
        monkeypatch.setattr(fluid, "EXACT_UP_TO", 2)
    cluster = Cluster.preset("dgx-h100", 4)
    codes, frac, lens = _flows(rng, seed)
    n = len(lens)
    sizes = [1 << 20] if seed % 3 == 0 else [0.0, 1024.0, 3 << 20, 12345.0] \
        if seed % 4 == 1 else [5 << 20]  # one size: every task ends at one time
    nbytes = np.array([float(rng.choice(sizes)) for _ in range(n)])
    lat = np.full(n, 2e-6) if seed % 2 else np.array([rng.choice([0.0, 1e-6]) for _ in range(n)])
    gate = _gate(rng, n, seed)
    whole = []
    at = fluid._at
    monkeypatch.setattr(fluid, "_at", lambda w, k: whole.append(len(w) == k) or at(w, k))
    runs = []
    for kind in (fluid._Fluid, _Indexed):
        bounds: list[float] = []
        flows = FairShare.of_edges(codes, frac, lens, cluster)
        est = kind(flows, nbytes, gate(), lat).run(lambda t, b=bounds: b.append(t) or False)
        assert est is not None
        runs.append((est, bounds))
    (got, got_b), (want, want_b) = runs
    assert got.time == want.time
    assert got.starts == want.starts
    assert got.ends == want.ends
    assert got.busiest == want.busiest
    assert got_b == want_b
    if seed % 4 != 2:  # one step: every task starts at once, through the slice
        assert any(whole)


def test_the_slice_is_taken_for_every_task_alone():
    assert fluid._at(np.arange(5), 5) == slice(None)
    some = np.array([0, 2, 4])
    assert fluid._at(some, 5) is some


def _first_seen(codes: list[int]) -> tuple[list[int], list[int]]:
    """The brute-force numbering: a dict in order of first appearance."""
    number: dict[int, int] = {}
    out = [number.setdefault(c, len(number)) for c in codes]
    return list(number), out


def _codes(rng: random.Random, case: int) -> list[int]:
    """Many codes over a small range: all seen early (the look-up alone), a few seen
    late only (numbered apart), most seen late (the table of them all), or few codes
    over a large range (``np.unique``)."""
    bound = rng.choice([5, 40, 300])
    n = first_seen.PREFIX * bound * rng.choice([3, 5])
    if case == 0:
        return [rng.randrange(bound) for _ in range(n)]
    if case == 1:
        late = rng.sample(range(bound, 2 * bound), rng.choice([1, 3]))
        head = [rng.randrange(bound) for _ in range(4 * n)]
        for c in late:
            head.insert(rng.randrange(first_seen.PREFIX * 2 * bound, len(head)), c)
        return head
    if case == 2:
        return [rng.randrange(bound) for _ in range(2 * first_seen.PREFIX * bound)] + \
            [rng.randrange(2 * bound) for _ in range(6 * first_seen.PREFIX * bound)]
    if case == 3:
        return [rng.randrange(1 << 20) for _ in range(rng.choice([0, 1, 50]))]
    return [rng.randrange(bound) for _ in range(rng.choice([1, 2 * bound]))]


@pytest.mark.parametrize("seed", range(25))
def test_the_numbering_is_the_first_seen_order(seed):
    codes = _codes(random.Random(seed), seed % 5)
    arr = np.array(codes, dtype=np.int64)
    got_order, got = first_seen.numbered(arr)
    want_order, want = _first_seen(codes)
    assert got_order.tolist() == want_order
    assert got.tolist() == want
    old_order, old = first_seen._numbered_all(arr, int(arr.max(initial=-1)) + 1)
    assert (old_order.tolist(), old.tolist()) == (want_order, want)


@pytest.mark.parametrize("late", [1, 2])
def test_a_code_seen_last_alone_is_numbered_last(late):
    """Many codes of a small range, then ``late`` new ones at the very end: the sample
    misses them, the look-up finds them lacking, and they are numbered after the rest."""
    bound = 10
    codes = [i % bound for i in range(first_seen.PREFIX * 4 * (bound + late))]
    codes += list(range(bound, bound + late))
    got_order, got = first_seen.numbered(np.array(codes, dtype=np.int64))
    assert (got_order.tolist(), got.tolist()) == _first_seen(codes)

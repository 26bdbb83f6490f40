"""The cost model's fluid simulation: a plan's tasks sharing the cluster's resources
max-min fairly, step by step (the model itself is described in
:mod:`reshard.planner.costing.cost`, which offers :func:`simulate`)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from reshard.planner.costing.fairshare import FairShare, Fill
from reshard.planner.costing.stepgate import OneStep, StepGate, gate_of, has_device
from reshard.planner.values.plan_view import PlanView
from reshard.planner.values.tasks import Task


@dataclass(frozen=True)
class Estimate:
    """A cost-model prediction.

    Attributes:
        time: predicted seconds for the whole plan.
        starts: per task (plan order) its predicted start time.
        ends: per task its predicted end time.
        busiest: the resource that carried the most bytes, and its bytes.
    """

    time: float
    starts: tuple[float, ...]
    ends: tuple[float, ...]
    busiest: tuple[str, int, float]


EXACT_UP_TO = 4096
"""Plans of up to this many tasks refill the fair shares at every event."""

DEFER_TIME = 0.002
"""In larger plans, starts and ends that take load off a full resource refill the
shares this long after the first of them (a fraction of the busiest resource's time:
the bytes it carries over its capacity), not at once: until then the other tasks keep
their rates, a feasible allocation that leaves the freed capacity idle, and a started
task waits, so the model errs slow (on the DeepSeek-V3 GB200 sync by 0.19%, 234
refills instead of 6,193). Smaller plans refill at every start, and after every end
that takes load off a full resource."""

START_SHARE = 0.05
"""A larger plan's started tasks wait this share of :data:`DEFER_TIME` at most for
their refill."""


STOP_MARGIN = 1e-6
"""A simulation told to stop (:func:`simulate`'s ``stop``) asks about its clock bound
shrunk by this share: the bound is exact in real numbers, and the simulation's own
rounding (events merged within 1e-12 of each other, loads added and taken off) moves its
end by far less than this, so a plan it stops is one whose full simulation the caller's
rule would reject."""

Stop = Callable[[float], bool]
"""``stop(t)``: whether a plan that takes at least ``t`` model seconds is of no use to
the caller (its rule rejects every such plan: the answer for ``t`` holds for every
longer time)."""


def simulate(plan: PlanView, stop: Stop | None = None) -> Estimate | None:
    """Run the fluid simulation of ``plan`` on ``plan.cluster``.

    Steps are groups: a device enters its next step when every task it has in earlier
    steps has ended; a task starts when all its devices entered its step, waits its
    latency, then moves its bytes at its max-min fair share of every resource on its
    path (:mod:`reshard.planner.costing.fairshare`; shares recomputed whenever a task
    starts or ends: after ends alone, only for the tasks that may change). A task's
    finish time is kept until its rate changes, so an event costs a few array
    operations over the tasks plus the refilling.

    ``stop`` (:data:`Stop`): at every event the simulation bounds its end from below
    (its clock, plus the bytes each resource has still to carry over its capacity:
    no share exceeds a capacity) and returns None, unfinished, once ``stop`` rejects
    that bound (less :data:`STOP_MARGIN`): the caller only needed to know whether the
    plan beats a time, and it cannot. Such an answer is no estimate: never remember it.
    """
    tasks = plan.tasks
    flows = FairShare(list(map(_PATH, plan.routes())), plan.cluster)
    # each int's float64, as float(nbytes) gives it (both round to nearest)
    nbytes = np.fromiter(map(_NBYTES, tasks), dtype=np.float64, count=len(tasks))
    carried, lat = _carried(flows, nbytes), plan.latencies()
    if stop is not None and _stops_at_once(tasks, carried, flows.capacity, lat, stop):
        return None  # what the run returns at its first event, without its step rule
    return _Fluid(flows, nbytes, gate_of(tasks), lat, carried).run(stop)


def _stops_at_once(tasks: Sequence[Task], carried: np.ndarray, capacity: np.ndarray,
                   lat: np.ndarray, stop: Stop) -> bool:
    """Whether :func:`simulate` told to ``stop`` stops at its first event (returns
    None), known before its step rule is built (a third of the 4x8 cold set's stopped
    runs stop there). The first event is the first started task's latency at the
    earliest, and its clock bound (:class:`_ClockBound`: nothing has flowed yet) that
    time plus the largest ``carried * per_byte``; ``stop`` rejects a time once it
    rejects a shorter one, and float addition and division round monotonically, so
    where ``stop`` rejects the least latency plus that, the run stops there too. Only
    where the run has a first event: some task has a device (then the step rule
    starts one at once: a task of the least step of those with a device finds each
    of its devices at its first step) and every latency is finite (else the run could
    stall there, and raise)."""
    if not any(map(has_device, tasks)) or not np.isfinite(lat).all():
        return False
    first = float(lat.min()) + float((carried * _per_byte(capacity)).max(initial=0.0))
    return stop(first / (1 + STOP_MARGIN))


def _per_byte(capacity: np.ndarray) -> np.ndarray:
    """Seconds a byte takes on each resource of ``capacity`` (0.0 where it has none:
    :class:`_ClockBound` reads no time off such a resource)."""
    with np.errstate(divide="ignore"):
        out: np.ndarray = np.where(capacity > 0, 1.0 / capacity, 0.0)
    return out


_PATH = operator.itemgetter(0)
"""A route's path."""

_NBYTES = operator.attrgetter("nbytes")
"""A task's bytes."""


def simulate_arrays(flows: FairShare, nbytes: np.ndarray, gate: StepGate | OneStep,
                    lat: np.ndarray) -> Estimate:
    """:func:`simulate` of a plan given as its parts: its tasks' paths, bytes (float),
    step rule and latencies, task by task in its order (a large plan whose sends are
    never built as tasks: :mod:`reshard.planner.costing.columns`)."""
    got = _Fluid(flows, nbytes, gate, lat).run()
    assert got is not None  # never told to stop
    return got


def simulated_time(flows: FairShare, nbytes: np.ndarray, gate: StepGate | OneStep,
                   lat: np.ndarray) -> float:
    """:func:`simulate_arrays`' time alone: the same run and the same float
    (``Estimate.time``), without each task's start and end as Python floats (a million
    of each at 1,024 devices, which a caller of the time alone never reads)."""
    run = _Fluid(flows, nbytes, gate, lat)
    run._events()
    return run.end_time()


def _carried(flows: FairShare, nbytes: np.ndarray) -> np.ndarray:
    """Bytes each resource of ``flows`` carries over the run: each edge's share of its
    transfer's ``nbytes`` (no product where every fraction is 1.0: ``1.0 * x`` is
    ``x``)."""
    return flows.edge_sums(nbytes)  # (of LARGE edges or more: block by block)


class _Fluid:
    """One simulation's state: per task its times, bytes left and rate; the fair
    shares last filled and what happened since."""

    def __init__(self, flows: FairShare, nbytes: np.ndarray, gate: StepGate | OneStep,
                 lat: np.ndarray, carried: np.ndarray | None = None) -> None:
        self.n = n = len(nbytes)
        self.flows = flows
        self.nbytes = nbytes
        self.carried = _carried(flows, nbytes) if carried is None else carried
        self.gate = gate
        self.lat = lat
        self.starts = np.zeros(n)
        self.ends = np.zeros(n)
        self.remaining = self.nbytes.copy()  # as of `since`
        self.since = np.zeros(n)
        self.flow_at = np.full(n, np.inf)  # time a started task's bytes begin to flow
        self.fin = np.full(n, np.inf)  # a flowing task's finish at its present rate
        self.flowing = np.zeros(n, dtype=bool)
        self.rate = np.zeros(n)
        self.now = 0.0
        # plans of more than EXACT_UP_TO tasks refill up to `window` late (DEFER_TIME)
        busiest_s = float((self.carried / flows.capacity).max(initial=0.0))
        self.window = DEFER_TIME * busiest_s if n > EXACT_UP_TO else None
        self.refill_at = np.inf  # a deferred refill's time
        self.started = False  # tasks started since the last fill
        self.freed = np.zeros(len(flows.capacity))  # load ended tasks took off, since the fill
        self.usage = np.zeros(len(flows.capacity))  # load the flowing tasks put on, at `rate`
        self.low = np.inf  # the lowest rate of the tasks ended since the last fill
        self.share = Fill(np.zeros(n), np.full(len(flows.capacity), np.inf))  # nothing flows

    def run(self, stop: Stop | None = None) -> Estimate | None:
        """Every event in time order until every task has ended (None: stopped early,
        :func:`simulate`)."""
        if not self._events(stop):
            return None
        flows, carried = self.flows, self.carried
        top = int(np.argmax(carried)) if len(carried) else -1
        busiest = (*flows.resource(top), float(carried[top])) if top >= 0 else \
            ("none", -1, 0.0)
        return Estimate(self.end_time(), tuple(self.starts.tolist()),
                        tuple(self.ends.tolist()), busiest)

    def end_time(self) -> float:
        """The run's end (:attr:`Estimate.time`), once :meth:`_events` has run."""
        return float(self.ends.max()) if self.n else 0.0

    def _events(self, stop: Stop | None = None) -> bool:
        """Every event in time order until every task has ended (False: stopped early,
        :func:`simulate`)."""
        self._enter(self.gate.start())
        finished = 0
        bound = _ClockBound(self) if stop is not None else None
        while finished < self.n:
            nxt = min(float(self.fin.min()), float(self.flow_at.min()), self.refill_at)
            if nxt == np.inf:
                raise RuntimeError("cost simulation stalled; the plan's order is inconsistent")
            if bound is not None and stop is not None and \
                    stop(bound.at(nxt) / (1 + STOP_MARGIN)):
                return False
            self.now = nxt
            ending, refill = self._start_flows((self.fin <= nxt * (1 + 1e-12)).nonzero()[0])
            if len(ending):
                refill = self._end(ending, finished + len(ending) == self.n) or refill
            if refill:
                self._refill()
            if len(ending):
                self.ends[ending] = nxt
                finished += len(ending)
                self._enter(self.gate.ended(ending))
        return True

    def _enter(self, ready: np.ndarray) -> None:
        """Tasks whose devices all entered their step start now (their bytes flow
        after their latency)."""
        at = _at(ready, self.n)
        self.starts[at] = self.now
        self.flow_at[at] = self.now + self.lat[at]

    def _start_flows(self, ending: np.ndarray) -> tuple[np.ndarray, bool]:
        """Tasks whose latency has passed begin to flow (one with no bytes ends at once):
        the tasks ending now, and whether the shares must be filled again now."""
        refill = self.now >= self.refill_at
        starting = (self.flow_at <= self.now).nonzero()[0]
        if len(starting):
            at = _at(starting, self.n)
            self.flow_at[at] = np.inf
            empty = self.remaining[at] <= 0
            ending = _union(ending, starting[empty])
            self.flowing[at] |= ~empty
            self.started = True
            if self.window is None:
                refill = True
            else:  # a larger plan's new tasks flow from the next refill on
                self.refill_at = min(self.refill_at, self.now + self.window * START_SHARE)
        return ending, refill

    def _end(self, ending: np.ndarray, last: bool = False) -> bool:
        """Tasks end: their load comes off. Whether the shares must be filled again
        now (only load taken off a full resource can change a rate). ``last``: these
        are every task not ended yet, so nothing flows after them and no load or share
        is read again (the run's answer is its starts, ends and carried bytes): their
        load is not summed, and nothing is filled again."""
        at = _at(ending, self.n)
        self.flowing[at] = False
        self.fin[at] = np.inf
        self.low = min(self.low, float(self.rate[at].min()))
        if last:
            self.rate[at] = 0.0
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
        self.rate[at] = 0.0
        return refill

    def _refill(self) -> None:
        """The fair shares filled again (after ends alone, what froze below them keeps
        its rate), and the finish times of the tasks whose rate changed."""
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
        at = _at(changed, self.n)
        old = self.rate[at]
        if old.any():
            on, off = self.flows.loads(changed, new, self.rate)
            self.usage += on - off
        else:  # none had a rate: their old load is 0.0 on every resource, on - 0.0 is on
            self.usage += self.flows.load(changed, new)
        now, remaining = self.now, self.remaining
        if old.any():  # else none moved a byte: where(old > 0, ...) keeps every remaining
            moved = np.where(np.isinf(old), remaining[at], old * (now - self.since[at]))
            remaining[at] = np.where(old > 0, np.maximum(0.0, remaining[at] - moved),
                                     remaining[at])
        self.since[at] = now
        r = new[at]
        self.rate[at] = r
        with np.errstate(divide="ignore"):
            self.fin[at] = now + np.where(np.isinf(r), 0.0, remaining[at] / r)


def _at(which: np.ndarray, n: int) -> np.ndarray | slice:
    """``which``, increasing distinct indices of ``n`` tasks, as an index: every task's
    slice where it is every task (then ``which`` is ``arange(n)``: the same elements in
    the same order, as views, without gathering or scattering through ``which``)."""
    return slice(None) if len(which) == n else which


def _union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.union1d(a, b)`` of two increasing arrays of distinct indices: either one
    where the other is empty (the union of an increasing array and nothing is itself),
    without the sort."""
    if not len(b):
        return a
    if not len(a):
        return b
    return np.union1d(a, b)


class _ClockBound:
    """A lower bound of a running simulation's end: at time ``t``, ``t`` plus each
    resource's bytes still to carry over its capacity, the most of these (the bytes
    carried so far are the flowing tasks' load, :attr:`_Fluid.usage`, over time)."""

    def __init__(self, fluid: _Fluid) -> None:
        self.fluid = fluid
        self.left = fluid.carried.astype(np.float64, copy=True)
        self.per_byte = _per_byte(fluid.flows.capacity)
        self.last = 0.0

    def at(self, t: float) -> float:
        """The bound at time ``t`` (the next event's; the load has been
        :attr:`_Fluid.usage` since the last call)."""
        self.left -= self.fluid.usage * (t - self.last)
        self.last = t
        return t + float((self.left * self.per_byte).max(initial=0.0))


__all__ = ["DEFER_TIME", "EXACT_UP_TO", "START_SHARE", "STOP_MARGIN", "Estimate", "Stop",
           "simulate", "simulate_arrays", "simulated_time"]

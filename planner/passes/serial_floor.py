"""When the ``least-concurrent`` pass can be ruled out before its floor is found.

The pass (:mod:`reshard.planner.passes.stages`) proposes its start plan's tasks one per
device and step (:func:`~reshard.planner.schedule.order.one_at_a_time`), and is skipped
where its floor, each device's tasks back to back (:func:`~reshard.planner.costing.cost.
one_at_a_time_time`, the most over the devices), could not be kept. That floor reads
every task's route (about a millisecond on a plan of a few hundred tasks), and on the
4x8 cold set it rules the pass out in about three of four searches, usually by far
(1.35-10x the plan to beat). Two cheaper proofs come first (:func:`serial_ruled_out`):

* Nothing to propose: where :func:`one_at_a_time` would give the start's own tasks
  (each task already at the step one after its devices' previous one, the steps in
  order: :func:`serial_unchanged`), the pass has no candidate, floor or not.
* One device's share of the floor: a device's tasks back to back
  (:func:`device_floor`, the same per-task seconds summed in the same order, without the
  device's conversions, taken down by :data:`MARGIN`) is no more than the floor, which
  is the most over the devices. Where the rule would not keep that, it would not keep
  the floor: the pass is skipped as it would have been. The devices tried are the one
  that sends the most tasks and the one that receives the most.

Where neither proves it, the floor is found as before: every answer is the same, only
the work differs.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from itertools import chain

import numpy as np

from reshard.planner.costing.cost import ARRAY_EDGES
from reshard.planner.costing.fairshare import path_arrays
from reshard.planner.ir import ReshardPlan
from reshard.planner.values.resources import KINDS, capacities
from reshard.planner.values.tasks import Task, TaskKind

MARGIN = 1e-9
"""A device's seconds are taken down by this share before they are compared (a sum
of fewer of the same terms in the same order is no larger in floating point; the
margin only makes that plain)."""


def serial_unchanged(tasks: Sequence[Task]) -> bool:
    """Whether :func:`~reshard.planner.schedule.order.one_at_a_time` gives ``tasks``
    back unchanged: every task is already at the step one after the last step of any
    of its devices (the step it would be moved to, so ``at_step`` keeps the task
    itself), and the steps never go down (the stable sort by step keeps the order).
    False is not a proof of a change."""
    last: dict[int, int] = {}
    get = last.get
    prev = -1
    for t in tasks:
        step = t.step
        if step < prev:
            return False
        devices = t.devices
        if step != 1 + max([get(d, -1) for d in devices], default=-1):
            return False
        for d in devices:
            last[d] = step
        prev = step
    return True


def busiest_devices(tasks: Sequence[Task]) -> Iterator[int]:
    """The device that is the root of the most tasks, then the one that receives the
    most (ties: the first counted; the second not counted where the first is all a
    caller reads), distinct: the devices :func:`serial_ruled_out` tries."""
    roots = Counter([t.root for t in tasks]).most_common()
    first = next((d for d, _ in roots if d >= 0), None)
    if first is not None:
        yield first
    second = most_received([t.receivers for t in tasks])
    if second is not None and second != first:
        yield second


COUNTED = 1 << 14
"""Receivers from which :func:`most_received` counts them as one array (fewer: a
``Counter``, without the arrays' fixed cost)."""


def most_received(receivers: Sequence[tuple[int, ...]]) -> int | None:
    """The device (not below 0) that the most of ``receivers`` name, ties to the one
    named first; None where there is none: a ``Counter``'s most common, by its order of
    first counts. From :data:`COUNTED` receivers on, one array: each tuple packed
    (one ``struct`` call, by its length), every device's count by ``bincount``, a tie
    told apart by the first place that names one of the tied (the same device)."""
    total = sum(map(len, receivers))
    if total < COUNTED:
        return next((d for d, _ in Counter(chain.from_iterable(receivers)).most_common()
                     if d >= 0), None)
    packs: dict[int, Callable[..., bytes]] = {}
    parts: list[bytes] = []
    for r in receivers:
        pack = packs.get(len(r))
        if pack is None:
            pack = packs[len(r)] = struct.Struct(f"{len(r)}q").pack
        parts.append(pack(*r))
    devices = np.frombuffer(b"".join(parts), dtype=np.int64)
    named = devices[devices >= 0]
    if not len(named):
        return None
    counts = np.bincount(named)
    tied = np.flatnonzero(counts == counts.max())
    if len(tied) == 1:
        return int(tied[0])
    return int(named[np.isin(named, tied).argmax()])


def device_floor(plan: ReshardPlan, device: int) -> float:
    """``device``'s tasks of ``plan`` back to back: per task its route's latency and its
    bytes over the slowest resource of its route, as :func:`~reshard.planner.costing.
    cost.one_at_a_time_time` finds them, added in task order without the device's
    conversions, less :data:`MARGIN`: no more than that floor (its most loaded
    device's sum, conversions first)."""
    cap = capacities(plan.cluster)
    kind_cap: tuple[np.ndarray, bool] | None = None  # (_kind_caps)
    slowest: dict[int, float] = {}  # by id of a shared path
    ones: dict[int, tuple[np.ndarray, bool]] = {}  # fractions all 1.0 by id (_slowest)
    copy = TaskKind.COPY
    total = 0.0
    for t, (path, lat) in zip(plan.tasks, plan.routes()):
        if t.root < 0 or t.kind is copy:  # Task.devices: its receivers only
            if device not in t.receivers:
                continue
        elif t.root != device and device not in t.receivers and device not in t.addends:
            continue
        per_byte = slowest.get(id(path))
        if per_byte is None and len(path) < ARRAY_EDGES:
            per_byte = slowest[id(path)] = max(
                (f / cap[r[0]] for r, f in path if f > 0), default=0.0)
        elif per_byte is None:
            if kind_cap is None:
                kind_cap = _kind_caps(np.array([cap[kind] for kind in KINDS]))
            per_byte = slowest[id(path)] = _slowest(path_arrays(path), kind_cap, ones)
        total += lat + per_byte * t.nbytes
    return total * (1 - MARGIN)


def _kind_caps(kind_cap: np.ndarray) -> tuple[np.ndarray, bool]:
    """Each kind's capacity, and whether :func:`_slowest` may take ``1 / least`` of
    them: none below 0, NaN or -0.0 (each 0 or more)."""
    return kind_cap, bool(
        ((kind_cap > 0) | ((kind_cap == 0) & ~np.signbit(kind_cap))).all())


def _slowest(arrays: tuple[np.ndarray, np.ndarray], caps: tuple[np.ndarray, bool],
             ones: dict[int, tuple[np.ndarray, bool]]) -> float:
    """A route's seconds a byte over its slowest resource (its codes and fractions
    ``arrays``; ``caps``: each kind's capacity, :func:`_kind_caps`): the most of
    ``frac / capacity`` over its edges with a fraction above 0. Where every fraction is
    1.0 (asked once per array, by id in ``ones``: routes of one form share theirs) and
    no capacity is below 0 (none NaN or -0.0), ``1 / least capacity``: the same float
    (rounding keeps ``1 / x`` falling as ``x`` rises, so the largest quotient is the
    least divisor's; a capacity of 0 on the route gives infinity either way)."""
    codes, frac = arrays
    kind_cap, at_least_zero = caps
    got = ones.get(id(frac))
    if got is None or got[0] is not frac:
        got = ones[id(frac)] = (frac, bool((frac == 1.0).all()))
    if got[1] and len(codes) and at_least_zero:
        return float(np.divide(1.0, kind_cap[codes % 8].min()))
    on = frac > 0
    return float((frac[on] / kind_cap[codes[on] % 8]).max(initial=0.0))


def serial_ruled_out(start: ReshardPlan, keeps: Callable[[float], bool]) -> bool:
    """Whether the ``least-concurrent`` pass is shown to keep nothing from ``start``
    without its floor: it has no candidate (:func:`serial_unchanged`), or ``keeps``
    (whether the pass's rule would keep a plan of that many seconds, never for a
    longer time when not for a shorter one) is false for one device's share of the
    floor (:func:`device_floor`). False: not shown (the floor decides)."""
    tasks = start.tasks
    if serial_unchanged(tasks):
        return True
    return any(not keeps(device_floor(start, d)) for d in busiest_devices(tasks))


__all__ = ["COUNTED", "MARGIN", "busiest_devices", "device_floor", "most_received",
           "serial_ruled_out", "serial_unchanged"]

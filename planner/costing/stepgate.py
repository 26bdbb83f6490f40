"""Which tasks of a stepped plan may start, as tasks end: the cost model's step rule.

A device runs its steps in order (:mod:`reshard.planner.values.tasks`): it enters its first
step at once and its next step when every task it has in the present one has ended; a
task starts when all its devices have entered its step. The bookkeeping is over
(device, step) **slots**, as arrays, so that an event of the simulation costs a few
array operations however many devices its tasks span (a 27k-task plan has 450k
(task, device) memberships).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

import numpy as np

from reshard.planner.costing.fairshare import distinct, ranges, sorted_distinct
from reshard.planner.values.tasks import Task, TaskKind

_STEP = operator.attrgetter("step")
"""A task's step."""

_RECEIVERS = operator.attrgetter("receivers")
"""A task's receivers."""

_ROOT = operator.attrgetter("root")
"""A task's root."""

_KIND = operator.attrgetter("kind")
"""A task's kind."""

_ADDENDS = operator.attrgetter("addends")
"""A task's addends."""


class StepGate:
    """The step rule over a plan's ``tasks`` (steps in any order of the tuple).

    Attributes:
        member_task: per membership (a task and one of its distinct devices), the
            task; memberships are grouped by task, in task order.
        member_dev: the membership's device (a task's distinct devices, ascending:
            the rule reads them as a set).
        need: per task, how many distinct devices it has.
    """

    def __init__(self, tasks: Sequence[Task], step: np.ndarray | None = None) -> None:
        need, member_dev = task_members(tasks)
        self._members(need, member_dev, _steps(tasks) if step is None else step)

    @classmethod
    def of_members(cls, need: np.ndarray, member_dev: np.ndarray,
                   step: np.ndarray) -> StepGate:
        """The step rule over tasks given as arrays: task ``t`` has the next ``need[t]``
        distinct devices of ``member_dev`` (in any order) and ``step[t]``."""
        out = cls.__new__(cls)
        out._members(need, member_dev, step)
        return out

    def _members(self, need: np.ndarray, member_dev: np.ndarray, step: np.ndarray) -> None:
        """Set up from every task's distinct devices and step (:meth:`of_members`)."""
        n = len(need)
        self.need = need
        self.member_task = np.repeat(np.arange(n, dtype=np.int64), self.need)
        self.member_dev = member_dev
        self._member_at = np.concatenate([[0], np.cumsum(self.need)])
        span = int(step.max(initial=0)) + 1
        # slots sorted by device, then step: a device's next slot is the next one
        keys, self._slot = _unique(self.member_dev * span + np.repeat(step, self.need))
        dev = keys // span
        nslots = len(keys)
        self._left = np.bincount(self._slot, minlength=nslots)
        self._has_next = np.zeros(nslots, dtype=bool)
        self._has_next[:-1] = dev[1:] == dev[:-1]
        self._first = np.flatnonzero(np.r_[True, dev[1:] != dev[:-1]]) if nslots else \
            np.zeros(0, dtype=np.int64)
        self._slot_tasks = SlotTasks(self._slot, self.member_task, nslots)
        self._arrived = np.zeros(n, dtype=np.int64)

    def start(self) -> np.ndarray:
        """The tasks that may start at once (every device enters its first step);
        ascending."""
        return self._enter(self._first)

    def ended(self, which: np.ndarray) -> np.ndarray:
        """The tasks that may start once the tasks ``which`` (each once, never again)
        have ended; ascending."""
        if not len(which):
            return which
        slots = self._slot[ranges(self._member_at[which], self._member_at[which + 1])]
        counts = np.bincount(slots, minlength=len(self._left))
        self._left -= counts
        # the slots touched, ascending: by their counts where they are many, else sorted
        touched = np.flatnonzero(counts) if len(slots) >= len(counts) // COUNTED_FROM \
            else sorted_distinct(slots)
        done = touched[self._left[touched] == 0]
        return self._enter(done[self._has_next[done]] + 1)

    def _enter(self, slots: np.ndarray) -> np.ndarray:
        """Devices enter the ``slots``' steps: the tasks whose every device is in."""
        if not len(slots):
            return np.zeros(0, dtype=np.int64)
        tasks = self._slot_tasks.of(slots)
        if len(tasks) >= len(self.need) // COUNTED_FROM:  # each task's count, all at once
            per_task = np.bincount(tasks, minlength=len(self.need))
            tasks = np.flatnonzero(per_task)
            times = per_task[tasks]
        else:
            tasks, times = np.unique(tasks, return_counts=True)
        self._arrived[tasks] += times
        ready: np.ndarray = tasks[self._arrived[tasks] == self.need[tasks]]
        return ready


COUNTED_FROM = 8
"""Entries (slots or tasks) an event names from which it counts them in a table of
every slot or task (``np.bincount``: linear, the same ascending values and counts)
rather than sorting them: from an eighth of the table's length."""


class SlotTasks:
    """The task of each membership in given slots (each slot entered once), with
    repeats, in any order: the memberships not yet entered scanned while an event
    enters :data:`SCANNED_FROM`'s share of them or more (a partial source's gate at
    1,024 devices enters its 2M memberships in two events: no index needed), else read
    through an index by slot, made once over the memberships left (a radix sort)."""

    def __init__(self, slot: np.ndarray, member_task: np.ndarray, nslots: int) -> None:
        self.slot, self.task, self.nslots = slot, member_task, nslots
        self.pending: np.ndarray | None = None  # memberships not entered (None: all)
        self.index: tuple[np.ndarray, np.ndarray] | None = None  # tasks by slot, starts

    def of(self, slots: np.ndarray) -> np.ndarray:
        """The tasks of the memberships in ``slots`` (distinct, none entered before)."""
        if self.index is None:
            pending = self.slot if self.pending is None else self.slot[self.pending]
            flag = np.zeros(self.nslots, dtype=bool)
            flag[slots] = True
            hit = flag[pending]
            if SCANNED_FROM * np.count_nonzero(hit) >= len(pending):
                where = np.flatnonzero(hit) if self.pending is None else self.pending[hit]
                self.pending = np.flatnonzero(~hit) if self.pending is None else \
                    self.pending[~hit]
                got: np.ndarray = self.task[where]
                return got
            self.index = self._indexed(pending)
        tasks, at = self.index
        read: np.ndarray = tasks[ranges(at[slots], at[slots + 1])]
        return read

    def _indexed(self, pending: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pending memberships' tasks by slot (``pending``: their slots), and each
        slot's first place there (the count of those in the slots before it)."""
        order = np.argsort(pending.astype(np.int16) if self.nslots < 1 << 15 else pending,
                           kind="stable")  # radix sort where the slots fit 16 bits
        tasks = self.task if self.pending is None else self.task[self.pending]
        at = np.concatenate([np.zeros(1, dtype=np.int64),
                             np.cumsum(np.bincount(pending, minlength=self.nslots))])
        return tasks[order], at


SCANNED_FROM = 4
"""An event entering a ``1 / SCANNED_FROM`` share or more of the memberships not yet
entered scans them (each scan leaves at most ``1 - 1 / SCANNED_FROM`` of them, so the
scans read at most ``SCANNED_FROM`` times the memberships in all); a smaller share:
:class:`SlotTasks` indexes those left, once."""


class OneStep:
    """The step rule where every task is in one step and has a device (:func:`gate_of`):
    every device enters that step, its first and last, at once, so every task starts at
    once and no end lets another start (what :class:`StepGate` answers there, without
    its (task, device) memberships: 2M at a 1,024-device plan of 2,048 chains)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def start(self) -> np.ndarray:
        """Every task; ascending."""
        return np.arange(self.n, dtype=np.int64)

    def ended(self, which: np.ndarray) -> np.ndarray:
        """None (every task started at once)."""
        return np.zeros(0, dtype=np.int64)


def gate_of(tasks: Sequence[Task]) -> StepGate | OneStep:
    """The step rule over ``tasks``: :class:`OneStep` where every task is in one step
    and has a device (a task of none never starts: :class:`StepGate`'s stall stays),
    else :class:`StepGate`."""
    if not tasks:
        return StepGate(tasks)
    step = _steps(tasks)
    if (step == step[0]).all() and (all(map(_RECEIVERS, tasks)) or
                                    all(map(has_device, tasks))):
        return OneStep(len(tasks))  # (a task with receivers has a device)
    return StepGate(tasks, step)


def _steps(tasks: Sequence[Task]) -> np.ndarray:
    """Every task's step, as an array."""
    return np.fromiter(map(_STEP, tasks), dtype=np.int64, count=len(tasks))


def has_device(task: Task) -> bool:
    """Whether :func:`gate_of` counts ``task`` as having a device (a receiver, or a
    root of a task other than a copy): one the one-step rule may start at once."""
    return bool(task.receivers) or (task.root >= 0 and task.kind is not TaskKind.COPY)


ARRAY_MEMBERS = 4096
"""Devices of a plan's tasks (counted with repeats) from which their distinct devices
are found as arrays (fewer: task by task, in order, without the arrays' fixed cost)."""


def distinct_devices(devs: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """Per task its count of distinct devices, and those devices task by task: in each
    task's order (few devices), or ascending (many: the distinct (task, device) keys,
    :func:`~reshard.planner.costing.fairshare.distinct`)."""
    n = len(devs)
    lens = np.fromiter(map(len, devs), dtype=np.int64, count=n)
    total = int(lens.sum())
    flat = np.fromiter(itertools.chain.from_iterable(devs), dtype=np.int64, count=total)
    if total < ARRAY_MEMBERS:
        if not _repeats(flat, lens):  # each task's devices distinct: as they are
            return lens, flat
        firsts = [dict.fromkeys(d) for d in devs]  # distinct, in order
        need = np.fromiter(map(len, firsts), dtype=np.int64, count=n)
        return need, np.fromiter(itertools.chain.from_iterable(firsts), dtype=np.int64,
                                 count=int(need.sum()))
    ndev = int(flat.max()) + 1
    keys = np.repeat(np.arange(n, dtype=np.int64) * ndev, lens) + flat
    task, dev = np.divmod(distinct(keys, n * ndev), ndev)
    return np.bincount(task, minlength=n), dev


def task_members(tasks: Sequence[Task]) -> tuple[np.ndarray, np.ndarray]:
    """Per task its count of distinct devices (:attr:`~reshard.planner.values.tasks.
    Task.devices`), and those devices task by task, each task's ascending: read as a
    task's receivers, its root and its addends (where ``devices`` names them: a root of
    a task other than a copy), each as one array over every task (a few maps in C, no
    Python call per task, no ``devices`` tuple built), then the distinct (task, device)
    keys, which sort them by task, then device."""
    n = len(tasks)
    recv = list(map(_RECEIVERS, tasks))
    nrecv = np.fromiter(map(len, recv), dtype=np.int64, count=n)
    root = np.fromiter(map(_ROOT, tasks), dtype=np.int64, count=n)
    copy = np.fromiter(map(operator.is_, map(_KIND, tasks), itertools.repeat(TaskKind.COPY)),
                       dtype=bool, count=n)
    rooted = (root >= 0) & ~copy  # devices name the root and the addends
    adds = list(map(_ADDENDS, tasks))
    nadds = np.fromiter(map(len, adds), dtype=np.int64, count=n) * rooted
    total = int(nrecv.sum())
    dev = [np.fromiter(itertools.chain.from_iterable(recv), dtype=np.int64, count=total),
           root[rooted]]
    task = [np.repeat(np.arange(n, dtype=np.int64), nrecv), np.flatnonzero(rooted)]
    if nadds.any():
        on = rooted.nonzero()[0].tolist()
        dev.append(np.fromiter(itertools.chain.from_iterable(adds[i] for i in on),
                               dtype=np.int64, count=int(nadds.sum())))
        task.append(np.repeat(np.arange(n, dtype=np.int64), nadds))
    devs, owners = np.concatenate(dev), np.concatenate(task)
    if not len(devs):
        return np.zeros(n, dtype=np.int64), devs
    ndev = int(devs.max()) + 1
    owner, member = np.divmod(distinct(owners * ndev + devs, n * ndev), ndev)
    return np.bincount(owner, minlength=n), member


def _repeats(flat: np.ndarray, lens: np.ndarray) -> bool:
    """Whether some task lists a device twice (``flat``: every task's devices in turn,
    ``lens`` of them a task): a sort of the (task, device) keys, two equal neighbours."""
    if len(flat) < 2:
        return False
    keys = np.repeat(np.arange(len(lens), dtype=np.int64) * (int(flat.max()) + 1), lens) + flat
    keys.sort()
    return bool((keys[1:] == keys[:-1]).any())


def _unique(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` of non-negative integers: by a flag per
    value where their range is not far larger than their count (linear, not a sort)."""
    bound = int(keys.max(initial=-1)) + 1
    if bound > 4 * len(keys) + 4096:
        got, inverse = np.unique(keys, return_inverse=True)
        return got, inverse.reshape(-1)
    seen = np.zeros(bound, dtype=bool)
    seen[keys] = True
    rank = np.cumsum(seen, dtype=np.int64) - 1
    return np.flatnonzero(seen), rank[keys]


__all__ = ["ARRAY_MEMBERS", "COUNTED_FROM", "SCANNED_FROM", "OneStep", "SlotTasks", "StepGate",
           "distinct_devices", "gate_of", "has_device", "task_members"]

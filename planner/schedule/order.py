"""The global task order every worker follows.

A plan's steps are groups whose tasks run concurrently on every device (one NCCL
group; gloo's asynchronous operations), so the order needs no packing of
device-disjoint rounds: the fluid sharing of the NICs that concurrency gives keeps
every NIC busy while it has bytes to move. Steps only express dependencies: a task's
step is one more than the latest step of any task whose result it reads (a transfer
of a reduced partial-sum piece after that piece's reduction, an intra-host all-gather
after the transfers that delivered its pieces), so reductions, transfers and
all-gathers of different pieces overlap (pipelining).

Inside a step the issue order is a rotation: source host ``i`` first addresses
destination host ``i + 1``, then ``i + 2``, ... (tasks sorted by the host distance
``(dst - src) mod H``), so that a backend issuing one operation at a time (or a
window of them) still spreads its early transfers over distinct NIC pairs; then
largest first. Every worker issues its tasks in this one order, so the
lowest-numbered unfinished task always has all its participants waiting on it: no
set of blocking collectives can deadlock.

Concurrency is not free on every backend: operations in flight at once compete for a
device's CPU and memory, and gloo's TCP streams through one NIC interleave less
smoothly than the fluid model's fair sharing. :func:`one_at_a_time` gives the same
tasks in device-disjoint steps; the planner keeps that form when the model predicts
no gain from concurrency (see :func:`reshard.planner.plan.plan_many`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.schedule import packed_sort
from reshard.planner.values.tasks import Task, TaskKind

PHASE = {
    TaskKind.REDUCE: 0,
    TaskKind.ALLREDUCE: 0,
    TaskKind.COPY: 1,
    TaskKind.SEND: 1,
    TaskKind.BROADCAST: 1,
    TaskKind.ALLGATHER: 2,
}


@dataclass(frozen=True, eq=False)
class OrderKeys:
    """The sort keys of tasks, column by column (one row per task): by step, then
    phase, then rotation distance, largest first, then tensor, box and root, then
    ``seq`` (the position the task was planned at: the order stays deterministic).

    Attributes:
        step: the task's step.
        phase: :data:`PHASE` of its kind.
        dist: rotation distance ``(host(first receiver) - host(root)) mod hosts``; 0
            for copies and all-gathers.
        nbytes: bytes moved.
        tensor: tensor index.
        box: (tasks, 2 * ndim) starts and stops, dim by dim, zero-padded to the widest.
        root: the root device (-1 for all-gathers).
        seq: the planning position.
    """

    step: np.ndarray
    phase: np.ndarray
    dist: np.ndarray
    nbytes: np.ndarray
    tensor: np.ndarray
    box: np.ndarray
    root: np.ndarray
    seq: np.ndarray

    @classmethod
    def of_tasks(cls, tasks: Sequence[Task], seq: np.ndarray, cluster: Cluster,
                 host: np.ndarray | None = None) -> OrderKeys:
        """The keys of ``tasks``, planned at positions ``seq``; ``host``: each device's
        host as an array indexed by device id (every task's devices among them), which
        finds the rotation distances in bulk (the same values)."""
        n = len(tasks)
        kinds = [t.kind for t in tasks]
        root = np.fromiter([t.root for t in tasks], dtype=np.int64, count=n)
        return cls(
            np.fromiter([t.step for t in tasks], dtype=np.int64, count=n),
            np.fromiter(map(PHASE.__getitem__, kinds), dtype=np.int64, count=n),
            _distances(tasks, cluster) if host is None else
            _bulk_distances(tasks, kinds, root, cluster, host),
            np.fromiter([t.nbytes for t in tasks], dtype=np.int64, count=n),
            np.fromiter([t.tensor for t in tasks], dtype=np.int64, count=n),
            _boxes(tasks), root, np.asarray(seq, dtype=np.int64))

    @classmethod
    def concat(cls, parts: Sequence[OrderKeys]) -> OrderKeys:
        """The rows of ``parts`` one after another (boxes padded to the widest)."""
        width = max((p.box.shape[1] for p in parts), default=0)
        rows = [p for p in parts if len(p.seq)]
        if len(rows) == 1 and rows[0].box.shape[1] == width and all(
                getattr(rows[0], f.name).dtype == np.int64 for f in dataclasses.fields(cls)):
            return rows[0]  # the others add no row: the same columns, not copied
        boxes = [np.pad(p.box, ((0, 0), (0, width - p.box.shape[1]))) for p in parts]
        cols = {f.name: np.concatenate([getattr(p, f.name) for p in parts])
                for f in dataclasses.fields(cls) if f.name != "box"}
        return cls(box=np.concatenate(boxes) if boxes else np.zeros((0, 0), np.int64),
                   **cols)

    def order(self) -> np.ndarray:
        """Row indices in the global order."""
        keys = [self.seq, self.root]
        keys += [self.box[:, j] for j in reversed(range(self.box.shape[1]))]
        keys += [self.tensor, -self.nbytes, self.dist, self.phase, self.step]
        return packed_sort.lexsort(keys)


def _distances(tasks: Sequence[Task], cluster: Cluster) -> np.ndarray:
    """:attr:`OrderKeys.dist` of ``tasks``, task by task."""
    nh = max(1, cluster.num_hosts)
    host = cluster.host_map
    copy = TaskKind.COPY
    return np.fromiter([(host[t.receivers[0]] - host[t.root]) % nh
                        if t.root >= 0 and t.kind is not copy else 0 for t in tasks],
                       dtype=np.int64, count=len(tasks))


def _bulk_distances(tasks: Sequence[Task], kinds: list[TaskKind], root: np.ndarray,
                    cluster: Cluster, host: np.ndarray) -> np.ndarray:
    """:func:`_distances` from arrays (``kinds`` and ``root``: the tasks'):
    ``(host[first receiver] - host[root]) mod hosts`` of every task, 0 where its root
    is -1 or it is a copy (the same values; task by task where some task has no
    receiver)."""
    n = len(tasks)
    try:
        first = np.fromiter([t.receivers[0] for t in tasks], dtype=np.int64, count=n)
    except IndexError:  # a receiver-less task: read as before
        return _distances(tasks, cluster)
    dist = host[first]
    dist -= host[root]
    np.remainder(dist, max(1, cluster.num_hosts), out=dist)
    dist[root < 0] = 0
    copy = TaskKind.COPY
    if copy in kinds:
        dist[np.fromiter([k is copy for k in kinds], dtype=bool, count=n)] = 0
    return dist


def _boxes(tasks: Sequence[Task]) -> np.ndarray:
    """:attr:`OrderKeys.box` of ``tasks``: one row of starts and stops a task, dim by
    dim, zero-padded to the widest (at once where every box has the same dims)."""
    boxes = [t.box for t in tasks]
    ndims = set(map(len, boxes))
    if len(ndims) == 1:  # every (start, stop) in turn, read flat
        (ndim,) = ndims
        bounds = itertools.chain.from_iterable(itertools.chain.from_iterable(boxes))
        return np.fromiter(bounds, dtype=np.int64, count=2 * ndim * len(boxes)
                           ).reshape(len(boxes), 2 * ndim)
    box = np.zeros((len(tasks), 2 * max(ndims, default=0)), dtype=np.int64)
    for i, t in enumerate(tasks):
        flat = [v for pair in t.box for v in pair]
        box[i, :len(flat)] = flat
    return box


def one_at_a_time(tasks: Sequence[Task]) -> tuple[Task, ...]:
    """The same tasks (in global order) restepped so that no device has two in one
    step: each task one step after the last step of any of its devices. A task that
    reads another's result shares a device with it (the data sits on one), so every
    dependency still points to an earlier step."""
    last: dict[int, int] = {}
    out = []
    for t in tasks:
        step = 1 + max((last.get(d, -1) for d in t.devices), default=-1)
        for d in t.devices:
            last[d] = step
        out.append(t.at_step(step))
    out.sort(key=lambda t: t.step)  # stable: every device keeps its order
    return tuple(out)

"""Routes of many small transfers at once (issue 62, round four).

A plan's broadcasts and reductions of a few dozen edges each are found edge by edge in
:func:`reshard.planner.costing.cost._hops_path`, a Python loop per task. Where the
cluster pipelines no relay pieces and has no shared bandwidth, every such task's route
is its edges' hops in order (each edge: its sender's link out, its receiver's link in,
and the two NICs where it changes host) and its latency the latest its devices are
reached, each edge a hop's latency after its sender was. This module finds both for all
the tasks of one call together, as arrays: the same codes in the same order, and the
same sums (each device's reach is its sender's plus its edge's wait, added in the same
order as the loop adds them), or None for a task whose edges reach a device twice
(then the loop answers it). A chain's reach is its waits' running sum (a row of one
table a chain); only the trees are walked a depth at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from reshard.planner.costing.fairshare import ranges
from reshard.planner.values.resources import DEV_IN, DEV_OUT, KIND_CODE, NIC_IN, NIC_OUT
from reshard.planner.values.tasks import Task, TaskKind

TABLE_UP_TO = 1 << 22
"""Tasks times devices up to which the reach is found by a table indexed by (task,
device); more: :func:`batch_routes` answers nothing (the loop does)."""


def edge_lists(task: Task) -> tuple[Sequence[int], Sequence[int]]:
    """The senders and receivers of a ``BROADCAST``'s or ``REDUCE``'s edges, in the
    order its route crosses them: a reduction's chain into its root; a fused sum's
    addends passing their running sums on first; a broadcast's chain or tree."""
    if task.kind is TaskKind.REDUCE:
        return task.receivers, (*task.receivers[1:], task.root)
    if task.addends:
        edges = [*task.sum_edges(), *task.edges()]
        return [a for a, _ in edges], [b for _, b in edges]
    return task.parents or (task.root, *task.receivers[:-1]), task.receivers


def batch_routes(senders: Sequence[Sequence[int]], receivers: Sequence[Sequence[int]],
                 host: np.ndarray, nic: np.ndarray, latency: float, intra_latency: float
                 ) -> tuple[list[np.ndarray], list[float | None]] | None:
    """Per task (its edges ``senders[t][i] -> receivers[t][i]``), the codes of its
    route (:func:`~reshard.planner.values.resources.code`, every fraction 1) and its
    latency (None where a device is reached twice), on a cluster whose devices'
    hosts and NICs are ``host`` and ``nic`` (indexed by device). None where the table
    would be too large (:data:`TABLE_UP_TO`)."""
    lens = np.fromiter(map(len, senders), dtype=np.int64, count=len(senders))
    total = int(lens.sum())
    a = np.fromiter(itertools.chain.from_iterable(senders), dtype=np.int64, count=total)
    b = np.fromiter(itertools.chain.from_iterable(receivers), dtype=np.int64, count=total)
    n = len(lens)
    size = int(max(a.max(initial=0), b.max(initial=0))) + 1
    if n * size > TABLE_UP_TO or not n or not lens.all() or not _on(a, b, host):
        return None  # too large, an empty task or a device off the cluster: the loop's
    starts = np.concatenate([[0], np.cumsum(lens)])
    codes, cross = _codes(a, b, host, nic)
    code_at = np.concatenate([[0], np.cumsum(np.where(cross, 4, 2))])[starts].tolist()
    paths = [codes[lo:hi] for lo, hi in itertools.pairwise(code_at)]
    wait = np.where(cross, latency, intra_latency)
    return paths, _reach(a, b, wait, lens, starts, size)


def _on(a: np.ndarray, b: np.ndarray, host: np.ndarray) -> bool:
    """Whether every device of ``a`` and ``b`` is one of the cluster's (``host``:
    each device's host, -1 where there is none)."""
    lo = min(int(a.min()), int(b.min()))
    hi = max(int(a.max()), int(b.max()))
    return lo >= 0 and hi < len(host) and min(int(host[a].min()), int(host[b].min())) >= 0


def _codes(a: np.ndarray, b: np.ndarray, host: np.ndarray, nic: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """The codes of the hops ``a[i] -> b[i]``, hop by hop (read only: each route's
    codes a view of them): the sender's link out, the receiver's link in, and where
    the hop changes host (``cross``, also returned) the sender's NIC out and the
    receiver's NIC in."""
    cross = host[a] != host[b]
    quad = np.empty((len(a), 4), dtype=np.int64)
    quad[:, 0] = a * 8 + KIND_CODE[DEV_OUT]
    quad[:, 1] = b * 8 + KIND_CODE[DEV_IN]
    quad[:, 2] = nic[a] * 8 + KIND_CODE[NIC_OUT]
    quad[:, 3] = nic[b] * 8 + KIND_CODE[NIC_IN]
    used = np.ones((len(a), 4), dtype=bool)
    used[:, 2] = used[:, 3] = cross
    codes = quad[used]
    codes.setflags(write=False)
    return codes, cross


def _reach(a: np.ndarray, b: np.ndarray, wait: np.ndarray, lens: np.ndarray,
           starts: np.ndarray, size: int) -> list[float | None]:
    """Per task, the latest its devices are reached (:func:`batch_routes`): each edge
    ``wait`` after its sender was reached by an earlier edge of the task (0 where none
    did), a depth at a time over every task together; None for a task that reaches a
    device twice."""
    total, n = len(a), len(lens)
    task = np.repeat(np.arange(n, dtype=np.int64), lens)
    edge = np.arange(total, dtype=np.int64)
    by = np.full(n * size, total, dtype=np.int64)  # the edge reaching each (task, device)
    kb = task * size + b
    by[kb] = edge
    twice = np.zeros(n, dtype=bool)
    twice[task[by[kb] != edge]] = True  # a (task, device) reached by two edges
    up = by[task * size + a]
    early = up < edge  # the sender was reached by an earlier edge (of its task)
    at = np.zeros(total)
    at[~early] = wait[~early]  # 0.0 + wait: the same float
    chain = _chained(a, b, lens, starts, twice)
    if chain.any():  # each chain's reach: its waits summed in order, a row each
        edges, reach = _running(wait, lens, starts, chain)
        at[edges] = reach
    tree = np.repeat(~chain, lens)
    # the edges each edge's receiver sends on, as ranges of `child` (the trees')
    child = np.flatnonzero(early & tree)
    child = child[np.argsort(up[child], kind="stable")]
    child_at = np.searchsorted(up[child], np.arange(total + 1))
    frontier = np.flatnonzero(~early & tree)
    while len(frontier):
        nxt = child[ranges(child_at[frontier], child_at[frontier + 1])]
        at[nxt] = at[up[nxt]] + wait[nxt]
        frontier = nxt
    top = np.maximum.reduceat(at, starts[:-1]) if n else np.zeros(0)
    return [None if t else max(0.0, v) for t, v in zip(twice.tolist(), top.tolist())]


def _chained(a: np.ndarray, b: np.ndarray, lens: np.ndarray, starts: np.ndarray,
             twice: np.ndarray) -> np.ndarray:
    """Per task, whether its edges are a chain (each edge from the last one's
    receiver) reaching no device twice: each edge's sender then was reached by the
    edge before it alone, and its reach is the running sum of its waits."""
    link = np.ones(len(a), dtype=bool)
    np.equal(a[1:], b[:-1], out=link[1:])
    link[starts[:-1]] = True  # a task's first edge follows no edge of its own
    out: np.ndarray = np.logical_and.reduceat(link, starts[:-1]) & ~twice
    return out


def _running(wait: np.ndarray, lens: np.ndarray, starts: np.ndarray, chain: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """The edges of the ``chain`` tasks and their reach: each chain's waits summed in
    order (a row of a table, padded with zeros after its end; ``np.cumsum`` adds a
    row's items one after another, as the loop does)."""
    which = np.flatnonzero(chain)
    width = lens[which]
    rows = np.repeat(np.arange(len(which), dtype=np.int64), width)
    edges = ranges(starts[which], starts[which] + width)
    cols = edges - np.repeat(starts[which], width)
    table = np.zeros((len(which), int(width.max())))
    table[rows, cols] = wait[edges]
    return edges, np.cumsum(table, axis=1)[rows, cols]


__all__ = ["TABLE_UP_TO", "batch_routes", "edge_lists"]

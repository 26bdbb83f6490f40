"""A run of chain broadcasts priced as arrays (issue 62, round nine).

A partial source's reduced pieces broadcast at 1,024 devices as 131,072 chains: each a
root on one host and a chain of receivers (``root -> receivers[0] -> receivers[1] ...``,
no tree, no addends). Such a task's route is its edges' hops in order (each: the
sender's link out, the receiver's link in, and both NICs where the edge changes host;
every fraction 1), whatever memo or form :func:`~reshard.planner.costing.cost.
task_routes` finds it by. Its latency is summed edge by edge (:func:`~reshard.planner.
costing.cost._hops_path`) from its edges' waits and, where the cluster pipelines relay
pieces, each relay's fill: for a chain of distinct devices every sender feeds one child
and is reached only by the edge before it, so the sums are the same floats for every
chain whose edges cross hosts at the same places and whose bytes cut into the same
piece. :func:`chain_routes` lays out the routes of every such task of a plan at once
(one array of codes, row by row: the codes :func:`task_routes` gives each) and asks the
latency of the first task of each (crossings, piece) pattern of :func:`~reshard.planner.
costing.cost.task_path`. A task of another shape, a repeated device or a device off the
cluster is left to :func:`task_routes`.

A reduction is the reverse chain, ``receivers[0] -> ... -> receivers[-1] -> root``
(round twelve: a partial source's 1,024 reductions of 1,023 addends each), laid out
alike from its row of receivers and root. A chain of :data:`~reshard.planner.costing.
cost.ARRAY_EDGES` edges or more has its latency summed as arrays (:mod:`~reshard.
planner.costing.chain_reach`: the sums :func:`task_path` makes for it).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from reshard.cluster import Cluster, pipeline_piece
from reshard.planner.costing.chain_reach import chain_latencies
from reshard.planner.costing.chain_rows import codes as chain_codes
from reshard.planner.costing.chain_rows import priced
from reshard.planner.costing.cost import ARRAY_EDGES, task_path
from reshard.planner.costing.fairshare import ranges
from reshard.planner.values.tasks import Task, TaskKind

CHAINS_FROM = 256
"""Chain broadcasts of one length in a plan from which they are laid out as arrays
(:func:`chain_routes`; fewer: by :func:`~reshard.planner.costing.cost.task_routes`)."""


@dataclass(frozen=True)
class ChainRoutes:
    """The routes of some of a plan's tasks (:func:`chain_routes`): ``index`` (their
    places among the tasks, ascending), each one's code count ``lens``, all their
    codes ``codes`` (task by task, each fraction 1), each one's latency ``lat``, and
    each one's count of devices ``need`` and devices ``members`` (task by task: its
    root and receivers, distinct)."""

    index: np.ndarray
    lens: np.ndarray
    codes: np.ndarray
    lat: np.ndarray
    need: np.ndarray
    members: np.ndarray


def chain_routes(tasks: Sequence[Task], cluster: Cluster, host: np.ndarray,
                 nic: np.ndarray, also: Mapping[int, int] | None = None
                 ) -> ChainRoutes | None:
    """The routes of ``tasks``' chain broadcasts (module docstring) on ``cluster``
    (``host``, ``nic``: each device's, -1 where none), in runs of :data:`CHAINS_FROM`
    or more of one length (counting ``also[length]`` more, priced elsewhere); None
    where there are none."""
    also = also or {}
    by_length: dict[tuple[TaskKind, int], list[int]] = {}
    for i, t in enumerate(tasks):
        if t.kind in _CHAINED and not t.parents and not t.addends:
            by_length.setdefault((t.kind, len(t.receivers)), []).append(i)
    parts = [got for (kind, m), idx in by_length.items()
             if m > 0 and len(idx) + (kind is TaskKind.BROADCAST and also.get(m, 0)) >=
             CHAINS_FROM
             if (got := _one_length([tasks[i] for i in idx], idx, cluster, host, nic))
             is not None]
    if len(parts) < 2:
        return parts[0] if parts else None
    index = np.concatenate([p.index for p in parts])
    order = np.argsort(index, kind="stable")
    lens = np.concatenate([p.lens for p in parts])
    starts = np.cumsum(lens) - lens
    codes = np.concatenate([p.codes for p in parts])
    need = np.concatenate([p.need for p in parts])
    member_at = np.cumsum(need) - need
    return ChainRoutes(index[order], lens[order],
                       codes[ranges(starts[order], starts[order] + lens[order])],
                       np.concatenate([p.lat for p in parts])[order], need[order],
                       np.concatenate([p.members for p in parts])[
                           ranges(member_at[order], member_at[order] + need[order])])


_CHAINED = frozenset((TaskKind.BROADCAST, TaskKind.REDUCE))
"""Kinds whose chains are laid out (without parents or addends): a broadcast's
``root -> receivers[0] -> ...``, a reduction's ``receivers[0] -> ... -> root``
(:func:`~reshard.planner.costing.hop_batch.edge_lists`)."""


def _rows(tasks: list[Task]) -> np.ndarray:
    """Each of ``tasks``' (of one kind and count of receivers) devices in chain order,
    as rows: a broadcast's root and receivers, a reduction's receivers and root; the
    receivers of tasks that share one tuple object read once."""
    n = len(tasks)
    roots = np.fromiter(map(attrgetter("root"), tasks), dtype=np.int64, count=n)
    chains = list(map(attrgetter("receivers"), tasks))
    ids = np.fromiter(map(id, chains), dtype=np.int64, count=n)
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    m = len(chains[0])
    distinct = np.fromiter(itertools.chain.from_iterable([chains[f] for f in first.tolist()]),
                           dtype=np.int64, count=len(first) * m).reshape(len(first), m)
    rows = np.empty((n, m + 1), dtype=np.int64)
    into = 0 if tasks[0].kind is TaskKind.REDUCE else 1  # where the receivers go
    rows[:, m if into == 0 else 0] = roots
    rows[:, into:into + m] = distinct[inverse.reshape(-1)]
    return rows


def _one_length(tasks: list[Task], idx: list[int], cluster: Cluster, host: np.ndarray,
                nic: np.ndarray) -> ChainRoutes | None:
    """:func:`chain_routes` of ``tasks`` (at ``idx``), of one receiver count, those
    whose devices are distinct and on the cluster (None: none are)."""
    rows = _rows(tasks)
    keep = priced(rows, host)
    if not keep.any():
        return None
    at = np.array(idx, dtype=np.int64)
    if not keep.all():
        rows, at = rows[keep], at[keep]
        tasks = [tasks[i] for i in np.flatnonzero(keep).tolist()]
    lens, codes, cross = chain_codes(rows, host, nic)
    sizes = np.fromiter(map(attrgetter("nbytes"), tasks), dtype=np.int64, count=len(tasks))
    return ChainRoutes(at, lens, codes, _latencies(sizes, cross, cluster, tasks.__getitem__),
                       np.full(len(at), rows.shape[1], dtype=np.int64), rows.reshape(-1))


def kept_routes(rows: np.ndarray, sizes: np.ndarray, cluster: Cluster, host: np.ndarray,
                nic: np.ndarray, task: Callable[[int], Task]) -> ChainRoutes | None:
    """The routes of chain broadcasts kept as columns (each one's root and receivers
    ``rows``, one length; its bytes ``sizes``; ``task(i)`` builds task ``i``), as
    :func:`chain_routes` lays them out where it would lay out every one of them (at
    least :data:`CHAINS_FROM`, of a length under :data:`~reshard.planner.costing.cost.
    ARRAY_EDGES`, every one's devices distinct and on the cluster); else None."""
    n, m = rows.shape[0], rows.shape[1] - 1
    if not 0 < m < ARRAY_EDGES or n < CHAINS_FROM or not priced(rows, host).all():
        return None
    lens, codes, cross = chain_codes(rows, host, nic)
    return ChainRoutes(np.arange(n, dtype=np.int64), lens, codes,
                       _latencies(sizes, cross, cluster, task),
                       np.full(n, m + 1, dtype=np.int64), rows.reshape(-1))


def _latencies(sizes: np.ndarray, cross: np.ndarray, cluster: Cluster,
               task: Callable[[int], Task]) -> np.ndarray:
    """Each chain's latency (its bytes ``sizes``, its edges' crossings ``cross``; task
    ``i`` is ``task(i)``): that of :func:`~reshard.planner.costing.cost.task_path` of
    the first task of its pattern (crossings and relay piece; module docstring); a
    chain of :data:`~reshard.planner.costing.cost.ARRAY_EDGES` edges or more summed
    as arrays (:func:`~reshard.planner.costing.chain_reach.chain_latencies`)."""
    if cross.shape[1] >= ARRAY_EDGES:
        return chain_latencies(sizes, cross, cluster)
    distinct, of_size = np.unique(sizes, return_inverse=True)
    pieces = np.array([pipeline_piece(cluster.relay_piece, n) for n in distinct.tolist()],
                      dtype=np.int64)
    _, piece = np.unique(pieces, return_inverse=True)  # each task's piece, numbered
    bits = cross.astype(np.int64) @ (1 << np.arange(cross.shape[1], dtype=np.int64))
    pattern = (piece.reshape(-1)[of_size.reshape(-1)] << cross.shape[1]) | bits
    _, first, inverse = np.unique(pattern, return_index=True, return_inverse=True)
    lats = np.array([task_path(task(f), cluster)[1] for f in first.tolist()])
    return lats[inverse.reshape(-1)]


__all__ = ["CHAINS_FROM", "ChainRoutes", "chain_routes", "kept_routes"]

"""A work list's tasks in the global order, its point-to-point rows still columns.

:mod:`reshard.planner.schedule.work` plans a large plan's point-to-point rows (sends)
as columns (:class:`~reshard.planner.schedule.point_rows.PointColumns`) and the other
slices as task objects. :func:`in_order` sorts both by the global order's keys
(:class:`~reshard.planner.schedule.order.OrderKeys`) and hands back the objects at their
places and the sends as columns in that order
(:class:`~reshard.planner.schedule.send_columns.OrderedTasks`). Where every task is a
send, the order is the sends' own (no object to place); the columns are gathered row by
row with :func:`numpy.take` (the same values as indexing, without its cost per row of a
two-dimensional array).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.schedule.broadcast_columns import BroadcastColumns
from reshard.planner.schedule.order import PHASE, OrderKeys
from reshard.planner.schedule.point_rows import PointColumns
from reshard.planner.schedule.send_columns import OrderedTasks, SendColumns
from reshard.planner.values.tasks import Task, TaskKind

SAME_FROM = 4096
"""Rows from which a send column that often holds one value (a tensor's, a step's, a
size's, a rank's) is written rather than gathered where it does (one pass to find it
one value, cheaper than the gather)."""


def in_order(objects: list[Task], obj_seq: np.ndarray, p2p: PointColumns, p_seq: np.ndarray,
             p_step: np.ndarray, host: np.ndarray, cluster: Cluster,
             known: OrderKeys | None = None, kept: BroadcastColumns | None = None
             ) -> OrderedTasks:
    """Every task in the global order (see :class:`OrderKeys`): ``objects`` planned at
    ``obj_seq``, the point-to-point rows of ``p2p`` planned at ``p_seq`` (-1: not a
    send) at steps ``p_step`` (``host``: each device's host), and broadcasts ``kept``
    as columns (keys ``known``) after the objects. The sends and ``kept`` stay columns."""
    sent = p_seq >= 0
    every = bool(sent.all())
    rows = None if every else np.flatnonzero(sent)  # None: every row (not listed)
    # every row: the columns themselves (the same values as taking every row)
    take: np.ndarray | slice = slice(None) if rows is None else rows
    nh = max(1, cluster.num_hosts)
    root, recv = p2p.root[take], p2p.recv[take]
    n_obj, n_kept = len(objects), 0 if kept is None else len(kept)
    dist = host[recv]
    dist -= host[root]
    np.remainder(dist, nh, out=dist)  # (host[recv] - host[root]) % nh, in place
    keys = OrderKeys.concat([
        _object_keys(objects, obj_seq if kept is None else np.arange(n_obj + n_kept),
                     cluster, host, known, n_kept),
        OrderKeys(p_step[take], np.broadcast_to(np.int64(PHASE[TaskKind.SEND]), len(root)),
                  dist, p2p.nbytes[take], p2p.tensor[take], p2p.box[take], root,
                  p_seq[take])])
    order = keys.order()
    if not n_obj and kept is None:  # every task a send, in the sends' order
        return OrderedTasks([], [], _sends(np.arange(len(order)), p2p, p_step,
                                           order if rows is None else rows[order]))
    is_obj, is_send = order < n_obj, order >= n_obj + n_kept
    picked = order[is_send] - n_obj - n_kept
    sends = _sends(np.flatnonzero(is_send), p2p, p_step, picked if rows is None else rows[picked])
    is_kept = ~(is_obj | is_send)  # after the objects in keys' rows
    return OrderedTasks([objects[i] for i in order[is_obj].tolist()],
                        np.flatnonzero(is_obj).tolist(), sends, None if kept is None else
                        kept.take(order[is_kept] - n_obj), np.flatnonzero(is_kept))


def _sends(position: np.ndarray, p2p: PointColumns, p_step: np.ndarray, picked: np.ndarray
           ) -> SendColumns:
    """The sends of rows ``picked`` of ``p2p`` (steps ``p_step``), at ``position``."""
    def pick(col: np.ndarray) -> np.ndarray:
        return np.take(col, picked, axis=0)

    def often_same(col: np.ndarray) -> np.ndarray:  # a tensor's, a step's, a size's
        return _same(col, len(picked)) if len(col) >= SAME_FROM and \
            bool((col == col[0]).all()) else pick(col)

    return SendColumns(position, often_same(p2p.tensor), pick(p2p.root), pick(p2p.recv),
                       often_same(p2p.nbytes), often_same(p_step), p2p.box,
                       often_same(p2p.ndim), box_rows=picked)  # boxes gathered when read


def _same(col: np.ndarray, n: int) -> np.ndarray:
    """``n`` rows of ``col``, every one of whose rows holds one value: that value ``n``
    times (the values any ``n`` rows of it gathered hold, written without the gather)."""
    return np.broadcast_to(col[:1], (n,))


def _object_keys(objects: list[Task], seq: np.ndarray, cluster: Cluster, host: np.ndarray,
                 known: OrderKeys | None, kept: int = 0) -> OrderKeys:
    """:meth:`OrderKeys.of_tasks` of ``objects`` and ``kept`` tasks after them at
    ``seq`` (``host``: each device's host), the last ones' ``known`` already (their seq
    aside: the same values)."""
    if known is None:
        return OrderKeys.of_tasks(objects, seq, cluster, host)
    head = len(objects) + kept - len(known.seq)
    return OrderKeys.concat([OrderKeys.of_tasks(objects[:head], seq[:head], cluster, host),
                             dataclasses.replace(known, seq=seq[head:])])

"""send_order.in_order (the sends-only order taken as the sends' own, the columns
gathered with numpy.take, the keys sorted by packed_sort) against the ordering it
replaces (numpy.lexsort of the keys, the columns indexed), with and without task
objects, every row a send or some rows not, uneven boxes and tied keys."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.planner.schedule import send_order
from reshard.planner.schedule.order import PHASE, OrderKeys
from reshard.planner.schedule.point_rows import PointColumns
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit._regular_clusters import regular_clusters

CLUSTER = regular_clusters(16, 8)["preset"]
HOST = np.array([CLUSTER.host_of(d) for d in range(128)], dtype=np.int64)


def _reference(objects, obj_seq, p2p, p_seq, p_step):
    """The ordering as it was: every key lexsorted, every column indexed."""
    rows = np.flatnonzero(p_seq >= 0)
    root, recv = p2p.root[rows], p2p.recv[rows]
    n_obj = len(objects)
    keys = OrderKeys.concat([
        OrderKeys.of_tasks(objects, obj_seq, CLUSTER),
        OrderKeys(p_step[rows], np.full(len(rows), PHASE[TaskKind.SEND], np.int64),
                  (HOST[recv] - HOST[root]) % CLUSTER.num_hosts, p2p.nbytes[rows],
                  p2p.tensor[rows], p2p.box[rows], root, p_seq[rows])])
    k = [keys.seq, keys.root, *(keys.box[:, j] for j in reversed(range(keys.box.shape[1]))),
         keys.tensor, -keys.nbytes, keys.dist, keys.phase, keys.step]
    order = np.lexsort(k)
    is_obj, is_send = order < n_obj, order >= n_obj
    p = rows[order[is_send] - n_obj]
    cols = (np.flatnonzero(is_send), p2p.tensor[p], p2p.root[p], p2p.recv[p], p2p.nbytes[p],
            p_step[p], p2p.box[p], p2p.ndim[p])
    return [objects[i] for i in order[is_obj].tolist()], np.flatnonzero(is_obj).tolist(), cols


def _columns(rng, n, ties):
    ndim = rng.integers(1, 4, n) if not ties else np.full(n, 2)
    box = np.zeros((n, 6), dtype=np.int64)
    for j in range(3):
        lo = rng.integers(0, 5 if ties else 1 << 12, n) * 64
        hi = lo + rng.integers(1, 3 if ties else 100, n)
        box[:, 2 * j] = np.where(j < ndim, lo, 0)
        box[:, 2 * j + 1] = np.where(j < ndim, hi, 0)
    root = rng.integers(0, 128, n)
    recv = (root + rng.integers(1, 127, n)) % 128
    return PointColumns(rng.integers(0, 2, n), root, recv,
                        rng.choice([1024, 4096, 1 << 33], n), box, ndim)


def _objects(rng, k):
    return [Task(TaskKind.SEND, int(rng.integers(0, 2)), ((64 * i, 64 * i + 8), (0, 8)),
                 int(rng.integers(0, 128)), (int(rng.integers(0, 128)),), 1024,
                 int(rng.integers(0, 2))) for i in range(k)]


def ordered_as_reference(objects, obj_seq, p2p, p_seq, p_step):
    """``in_order``'s answer, checked against ``_reference``'s: the same objects and
    positions, and every send column of the same dtype, shape and values."""
    got = send_order.in_order(objects, obj_seq, p2p, p_seq, p_step, HOST, CLUSTER)
    objs, positions, cols = _reference(objects, obj_seq, p2p, p_seq, p_step)
    assert got.own_objects == objs and list(got.own_positions) == positions
    s = got.send_columns
    for a, b in zip((s.position, s.tensor, s.root, s.recv, s.nbytes, s.step, s.box, s.ndim),
                    cols):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return got, cols


@pytest.mark.parametrize("seed", range(8))
def test_in_order_is_the_ordering_it_replaces(seed):
    rng = np.random.default_rng(seed)
    n = 5000 + 37 * seed
    p2p = _columns(rng, n, ties=seed % 2 == 0)
    objects = _objects(rng, 0 if seed < 4 else 40)
    seq = rng.permutation(n + len(objects)).astype(np.int64)
    obj_seq, p_seq = seq[:len(objects)], seq[len(objects):].copy()
    if seed % 4 >= 2:
        p_seq[rng.integers(0, n, n // 5)] = -1  # rows planned as general cells
    p_step = rng.integers(0, 2, n)
    got, _ = ordered_as_reference(objects, obj_seq, p2p, p_seq, p_step)
    assert not len(got.kept_positions) and got.kept is None


@pytest.mark.parametrize("seed", range(4))
def test_point_rows_columns_are_the_rows_indexed(seed):
    """PointToPoint.columns (a table's every row taken as it is, some rows gathered
    with numpy.take) against indexing each table's corners by its rows."""
    from reshard.planner.cells.decompose import CellTable
    from reshard.planner.schedule.point_rows import PointToPoint

    rng = np.random.default_rng(seed)
    rows_of, tables = PointToPoint(), []
    for t in range(3):
        n, nd = int(rng.integers(5, 40)), 1 + (t + seed) % 3
        lo = rng.integers(0, 100, (n, nd))
        table = CellTable(lo, lo + rng.integers(1, 9, (n, nd)), np.ones(n, np.int64),
                          np.zeros(n, np.int64), np.zeros(n, np.int64), (), ())
        rows = np.arange(n) if t == seed % 3 else np.flatnonzero(rng.integers(0, 2, n))
        rows_of.add(t, table, rows, rng.integers(0, 9, len(rows)),
                    rng.integers(0, 9, len(rows)), rng.integers(1, 99, len(rows)))
        tables.append((table, rows))
    got = rows_of.columns()
    width = 2 * max(table.lo.shape[1] for table, _ in tables)
    want = np.concatenate([np.pad(np.stack([table.lo[rows], table.hi[rows]], axis=2).reshape(
        len(rows), -1), ((0, 0), (0, width - 2 * table.lo.shape[1]))) for table, rows in tables])
    assert np.array_equal(got.box, want)
    assert np.array_equal(got.ndim, np.concatenate([np.full(len(r), t.lo.shape[1])
                                                    for t, r in tables]))


def test_largest_first_is_the_stable_sort_or_none_where_that_is_every_index():
    """work.largest_first against np.argsort(-nbytes, kind="stable"): None exactly where
    that sort is the identity (sizes that never grow, ties included)."""
    from reshard.planner.schedule.work import largest_first

    rng = np.random.default_rng(7)
    cases = [np.zeros(0, np.int64), np.array([5]), np.full(9, 1024), np.array([9, 9, 3, 3, 1]),
             np.array([1, 2]), np.array([9, 3, 3, 4]), rng.integers(0, 4, 50),
             -np.sort(-rng.integers(0, 4, 50))]
    for nbytes in cases:
        nbytes = nbytes.astype(np.int64)
        want = np.argsort(-nbytes, kind="stable")
        got = largest_first(nbytes)
        if got is None:
            assert np.array_equal(want, np.arange(len(nbytes)))
        else:
            assert np.array_equal(got, want) and not np.array_equal(want, np.arange(len(want)))

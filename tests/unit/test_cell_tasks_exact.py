"""plan_allgather and split_box (planner/cells/cell_tasks.py) against their references
(their former forms): the same tasks in the same order and the same loads left behind."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.layout import box_size, chunk_bounds
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.cell_tasks import (
    _copies,
    _send,
    plan_allgather,
    split_box,
    split_dim,
)
from reshard.planner.cells.decompose import Cell
from reshard.planner.values.tasks import Buffer, Task, TaskKind


def _allgather_reference(cell, tensor, itemsize, loads, step=0):
    """plan_allgather as it was: each host's holders found by a scan of all holders,
    each piece's bytes and each member's share worked out in the loop."""
    nbytes = box_size(cell.box) * itemsize
    tasks = _copies(cell, tensor, nbytes, step)
    by_host = {}
    for n in sorted(cell.needers - cell.holders):
        by_host.setdefault(loads.host(n), []).append(n)
    for h, members in sorted(by_host.items()):
        local = [d for d in cell.holders if loads.host(d) == h]
        if local or len(members) == 1:
            root = loads.pick_root(local or cell.holders, {h}, nbytes)
            chain = tuple(members)
            loads.charge(root, chain, nbytes)
            kind = TaskKind.SEND if len(chain) == 1 else TaskKind.BROADCAST
            tasks.append(Task(kind, tensor, cell.box, root, chain, nbytes, step))
            continue
        pieces = split_box(cell.box, len(members))
        for m, piece in zip(members, pieces):
            pbytes = box_size(piece) * itemsize
            if pbytes == 0:
                continue
            root = loads.pick_sender(cell.holders, m, pbytes)
            tasks.append(_send(piece, tensor, root, m, pbytes, loads, step))
        for m in members:
            loads.dev_in[m] += nbytes * (len(members) - 1) / len(members)
        tasks.append(Task(TaskKind.ALLGATHER, tensor, cell.box, -1, tuple(members), nbytes,
                          step + 1, source=Buffer.DST, pieces=pieces))
    return tasks


def _tables(loads):
    return [dict(getattr(loads, name)) for name in ("nic_out", "nic_in", "dev_out", "dev_in")]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("preset", ["dgx-h100", None])
def test_allgather_tasks_and_loads_are_the_reference_s(seed, preset):
    rng = random.Random(seed)
    cluster = Cluster.regular(6, 8, preset=preset) if preset else Cluster.regular(6, 8)
    a, b = Loads(cluster), Loads(cluster)
    devices = list(range(48))
    for k in range(12):
        holders = frozenset(rng.sample(devices, rng.choice([1, 2, 5, 8, 16])))
        needers = frozenset(rng.sample(devices, rng.choice([3, 8, 20, 40])))
        rows = rng.choice([1, 3, 7, 96])
        box = ((0, rows), (0, rng.choice([5, 64])))
        cell = Cell(box, holders, needers)
        want = _allgather_reference(cell, k, 2, a, step=k)
        got = plan_allgather(cell, k, 2, b, step=k)
        assert got == want
        assert _tables(b) == _tables(a)
        assert [list(t) for t in _tables(b)] == [list(t) for t in _tables(a)]  # key order


def test_split_box_is_the_chunk_rule_piece_by_piece():
    rng = random.Random(0)
    for _ in range(400):
        box = tuple((a, a + rng.choice([0, 1, 3, 7, 64, 100])) for a in
                    (rng.randrange(50) for _ in range(rng.randrange(1, 4))))
        k = rng.choice([1, 2, 3, 5, 8, 9])
        d = rng.randrange(len(box))
        lo, hi = box[d]
        want = tuple((*box[:d], (lo + a, lo + b), *box[d + 1:])
                     for a, b in (chunk_bounds(hi - lo, k, i) for i in range(k)))
        assert split_box(box, k, d) == want
        assert split_box(box, k) == split_box(box, k, split_dim(box, k))
    assert split_box((), 3) == ((), (), ())

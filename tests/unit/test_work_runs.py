"""WorkList's runs of general slices (planner/schedule/work.py): add_cells without a
splitter (the lists extended at once) against the per-piece loop (forced by a
splitter that cuts nothing), and plan's general runs (every slice general: one run;
mixed with point-to-point rows: the runs between them) against each slice planned in
turn, largest first (the cell planner cell by cell, a row charged as it comes): the
same tasks, the same loads."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.cells import cell_tasks
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.decompose import Cell, CellTable
from reshard.planner.schedule.work import WorkList
from tests.unit._regular_clusters import regular_clusters

HOSTS, GPUS = 6, 8


def _cells(rng, devices, n, start=0):
    return [Cell(((0, rng.choice([1, 2, 4])), (k, k + rng.choice([1, 3]))),
                 frozenset(rng.sample(devices, rng.choice([1, 1, 2]))),
                 frozenset(rng.sample(devices, rng.choice([1, 2, 5]))))
            for k in range(start, start + n)]


def _state(wl):
    return (list(wl._nbytes), list(wl._after), list(wl._ref), list(wl.general),
            dict(wl._last_step))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("short", [None, "after", "cells"])
def test_add_cells_without_a_splitter_is_the_per_piece_loop(seed, short):
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    devices = list(cluster.devices)
    states = []
    for split in (None, lambda cell, nbytes: [cell]):
        rng = random.Random(seed)
        wl = WorkList(cluster, Loads(cluster))
        for tensor in range(3):
            cells = _cells(rng, devices, rng.randrange(1, 40))
            after = [rng.randrange(3) for _ in cells]
            if short == "after":
                after = after[:len(after) // 2]
            elif short == "cells":
                after = [*after, 7, 7]
            wl.add_cells(tensor, cells, rng.choice([1, 2]), after, split)
        states.append(_state(wl))
    assert states[0] == states[1]
    assert len(states[0][3]) > 3


def _table(rng, cluster, n):
    """``n`` rows of one tensor: some point to point (one holder, one needer on another
    NIC), the others general."""
    devices = list(cluster.devices)
    lo = np.array([[0, 4 * k] for k in range(n)], dtype=np.int64)
    hi = lo + np.array([[rng.choice([1, 2, 3]), 4] for _ in range(n)], dtype=np.int64)
    holder_sets = (frozenset({devices[0]}), frozenset({devices[9]}),
                   frozenset(devices[20:22]))
    needer_sets = (frozenset({devices[30]}), frozenset({devices[41]}),
                   frozenset(devices[12:15]))
    return CellTable(lo, hi, np.prod(hi - lo, axis=1),
                     np.array([rng.randrange(3) for _ in range(n)], dtype=np.int64),
                     np.array([rng.randrange(3) for _ in range(n)], dtype=np.int64),
                     holder_sets, needer_sets)


def _slices(seed, cluster, mixed):
    """Each tensor's slices as added: (tensor, cell, step) each."""
    rng = random.Random(seed)
    devices = list(cluster.devices)
    out = []
    for tensor in range(2):
        if mixed and tensor == 1:
            table = _table(rng, cluster, 50)
            out.append((tensor, table, [rng.randrange(2) for _ in range(len(table))]))
        else:
            cells = _cells(rng, devices, 40)
            out.append((tensor, cells, [rng.randrange(2) for _ in cells]))
    return out


def _work_list(cluster, slices, itemsizes):
    wl = WorkList(cluster, Loads(cluster))
    for tensor, cells, after in slices:
        if isinstance(cells, CellTable):
            wl.add_table(tensor, cells, itemsizes[tensor], np.array(after, np.int64), None)
        else:
            wl.add_cells(tensor, cells, itemsizes[tensor], after, None)
    return wl


def _in_turn(cluster, slices, itemsizes):
    """Every slice planned in turn, largest first (ties as added): a general cell by
    plan_broadcast, a table's point-to-point row charged."""
    loads = Loads(cluster)
    flat = []
    for tensor, cells, after in slices:
        table = isinstance(cells, CellTable)
        rows = cells.cells() if table else cells
        flat += [(tensor, c, s, table) for c, s in zip(rows, after)]
    order = sorted(range(len(flat)),
                   key=lambda i: -flat[i][1].size * itemsizes[flat[i][0]])
    tasks = []
    for i in order:
        tensor, cell, step, table = flat[i]
        nbytes = cell.size * itemsizes[tensor]
        if table and len(cell.holders) == len(cell.needers) == 1 and \
                cell.holders != cell.needers:  # a table's point-to-point row
            loads.charge(*cell.holders, tuple(cell.needers), nbytes)
        else:
            tasks.append(cell_tasks.plan_broadcast(cell, tensor, itemsizes[tensor], loads,
                                                   step))
    return tasks, loads


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mixed", [False, True])
def test_plan_s_general_runs_are_each_slice_in_turn(seed, mixed):
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    itemsizes = [2, 4]
    slices = _slices(seed, cluster, mixed)
    wl = _work_list(cluster, slices, itemsizes)
    planned = wl._plan_slices(cell_tasks.plan_broadcast, itemsizes, expect=False,
                              relays=False, first=())
    want_tasks, want = _in_turn(cluster, slices, itemsizes)
    assert planned.tasks == want_tasks
    assert len(planned.general) < len(planned.ref) if mixed else \
        len(planned.general) == len(planned.ref)
    for name in ("nic_out", "nic_in", "dev_out", "dev_in"):
        assert dict(getattr(wl.loads, name)) == dict(getattr(want, name)), name

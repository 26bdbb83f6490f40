"""WorkList.plan of point-to-point rows only (an all-to-all's table): charged in the
order the rows were added, not gathered into the largest-first order (sums of whole
bytes), against the path it replaces (forced by ``EXACT = 0``): the same tasks, the
same loads (floats and key order), the same expectations."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from reshard.layout import chunk_bounds
from reshard.planner.cells import cell_tasks
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.decompose import decompose_table
from reshard.planner.schedule import work
from reshard.planner.schedule.work import WorkList
from tests.unit._regular_clusters import regular_clusters

HOSTS, GPUS = 6, 8


def _tables(loads):
    return [dict(getattr(loads, name))
            for name in ("nic_out", "nic_in", "dev_out", "dev_in", "expected")]


def _plan(cluster, shape, src, dst, itemsize):
    rows, cols = shape
    holders = {((*chunk_bounds(rows, len(src), i),), (0, cols)): frozenset({d})
               for i, d in enumerate(src)}
    needers = {((0, rows), (*chunk_bounds(cols, len(dst), i),)): frozenset({d})
               for i, d in enumerate(dst)}
    table = decompose_table(shape, holders, needers)
    loads = Loads(cluster)
    wl = WorkList(cluster, loads)
    wl.add_table(0, table, itemsize, np.zeros(len(table), np.int64), None)
    ordered = wl.plan(cell_tasks.plan_broadcast, [itemsize], expect=True, relays=True)
    return ordered.tasks(), loads, not wl._planned.general


def _cluster(variant):
    if variant == "one-nic":
        return dataclasses.replace(regular_clusters(HOSTS, GPUS)["two-nics"], nics_per_host=1)
    return regular_clusters(HOSTS, GPUS)[variant]


@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics", "one-nic"])
@pytest.mark.parametrize("shape", [(61, 53), (96, 48), (7, 300)])
def test_point_to_point_rows_charged_as_added_are_the_largest_first_charges(
        variant, shape, monkeypatch):
    cluster = _cluster(variant)
    src = [d for h in (0, 1, 2) for d in cluster.hosts[h]]
    dst = [d for h in (3, 4, 5) for d in cluster.hosts[h]]
    got_tasks, got, direct = _plan(cluster, shape, src, dst, 2)
    monkeypatch.setattr(work, "EXACT", 0)  # the gathered, largest-first charges
    want_tasks, want, _ = _plan(cluster, shape, src, dst, 2)
    assert len(got_tasks) > 50
    # no row relayed (one NIC a host, or every NIC as loaded): charged as added
    assert direct or not (variant == "one-nic" or shape == (96, 48))
    assert got_tasks == want_tasks
    assert _tables(got) == _tables(want)
    assert [list(t) for t in _tables(got)] == [list(t) for t in _tables(want)]
    assert (got._epoch, got.shared) == (want._epoch, want.shared)

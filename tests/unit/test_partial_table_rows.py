"""A partial source's cells as a CellTable (reduce.decompose_pieces with ``table``: the
work list keeps its point-to-point rows as columns) against the cell list it replaces
(forced by decompose_cells in decompose_rows' place): the same plans and the same cold
estimates; and the work list's bulk charges and expectations, which decline where a
load holds a fraction (a reduction's), against the same cells planned as general ones."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.cells import cell_tasks, reduce
from reshard.planner.cells import decompose as dec
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.decompose import CellTable
from reshard.planner.estimates import CostCache, estimate_many
from reshard.planner.plan import plan_many
from reshard.planner.schedule.work import WorkList
from tests.unit._regular_clusters import regular_clusters

CLUSTERS = {"dgx": Cluster.preset("dgx-h100", 4, 4),
            "regular": Cluster.regular(4, 3, nic_bandwidth=1e9, intra_bandwidth=4e9,
                                       latency=2e-5),
            "shared": Cluster.regular(4, 4, nic_bandwidth=1e9, intra_bandwidth=4e9,
                                      latency=2e-5, shared_bandwidth=3e9)}
MOVES = [("RS1+P0", "S0S1"), ("RR+P0", "S1S0"), ("RS0+P1", "RS10"), ("S1R+P0", "S01R"),
         ("RR+P01", "RS0")]


def _request(cluster, src, dst, rows):
    devices = list(cluster.devices)
    n = 2 * rows
    a = DeviceMesh((rows, 2), devices[:n])
    b = DeviceMesh((rows, 2), devices[n:2 * n] if len(devices) >= 2 * n else devices[:n])
    return (rows * 64, 96), "bfloat16", Layout(a, src), Layout(b, dst)


def _answers(requests, cluster):
    out = []
    for req in requests:
        out.append(estimate_many([(*req, cluster)], cache=CostCache()))
        for strategy in ("send_recv", "broadcast"):
            out.append(plan_many([req], cluster=cluster, strategy=strategy).digest())
    return out


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_a_partial_source_s_table_plans_as_its_cells(name, monkeypatch):
    cluster = CLUSTERS[name]
    requests = [_request(cluster, s, d, rows) for s, d in MOVES for rows in (2, 4)
                if 4 * rows <= len(cluster.devices)]
    monkeypatch.setattr(dec, "CELLS_FROM", 1)  # a table for every partial source
    taken = []
    mostly = reduce._mostly_point_to_point
    monkeypatch.setattr(reduce, "_mostly_point_to_point",
                        lambda table: taken.append(mostly(table)) or taken[-1])
    got = _answers(requests, cluster)
    monkeypatch.setattr(reduce, "decompose_rows", dec.decompose_cells)  # the cell list
    want = _answers(requests, cluster)
    assert got == want
    if name == "shared":  # the columns leave shared bandwidth out: never a table
        assert not taken
    else:
        assert any(taken)  # some source went as a table


def _p2p_table(rng, cluster, n, mixed):
    """``n`` point-to-point rows between hosts and within them, of odd sizes (sums of
    them then end odd or even); ``mixed``: some rows from a device to itself (general
    cells) among them."""
    devices = list(cluster.devices)
    lo = np.array([[0, 8 * k] for k in range(n)], dtype=np.int64)
    hi = lo + np.array([[rng.choice([1, 3, 5]), 7] for _ in range(n)], dtype=np.int64)
    holder_sets = tuple(frozenset({d}) for d in devices[:4] + devices[8:10])
    needer_sets = tuple(frozenset({d}) for d in devices[4:8] + devices[10:20] +
                        devices[2:3] * mixed)
    return CellTable(lo, hi, np.prod(hi - lo, axis=1),
                     np.array([rng.randrange(len(holder_sets)) for _ in range(n)]),
                     np.array([rng.randrange(len(needer_sets)) for _ in range(n)]),
                     holder_sets, needer_sets)


def _loads(cluster, fraction):
    """Loads from before (a reduction's), ``fraction`` above whole numbers; at 0.5 near
    2 ** 52, where an addition rounds by the parity of the sum so far: sums of whole
    bytes then depend on their order."""
    base = 2.0 ** 52 - 2000 if fraction == 0.5 else 0.0
    loads = Loads(cluster)
    for d in list(cluster.devices)[:12]:
        loads.dev_out[d] += base + 1000.0 + fraction
        loads.nic_in[loads.nic(d)] += base + 700.0 + fraction
        loads.expected[("nic_out", loads.nic(d))] += base + 1900.0 + fraction
    return loads


def _plan(cluster, table, after, as_table, fraction, planner):
    wl = WorkList(cluster, _loads(cluster, fraction))
    if as_table:
        wl.add_table(0, table, 1, after, None)
    else:
        wl.add_cells(0, table.cells(), 1, after.tolist(), None)
    ordered = wl.plan(planner, [1], expect=True, relays=planner is cell_tasks.plan_broadcast)
    tables = [dict(getattr(wl.loads, name))
              for name in ("nic_out", "nic_in", "dev_out", "dev_in", "expected")]
    return ordered.tasks(), tables


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.5])
@pytest.mark.parametrize("planner", [cell_tasks.plan_send_recv, cell_tasks.plan_broadcast])
@pytest.mark.parametrize("mixed", [False, True])
def test_point_to_point_rows_are_the_general_cells_even_over_fractions(seed, fraction,
                                                                       planner, mixed):
    cluster = regular_clusters(6, 8)["preset"]
    rng = random.Random(seed)
    table = _p2p_table(rng, cluster, 300, mixed)
    after = np.array([rng.randrange(2) for _ in range(len(table))], dtype=np.int64)
    got = _plan(cluster, table, after, True, fraction, planner)
    want = _plan(cluster, table, after, False, fraction, planner)
    assert got[0] == want[0]
    # the relay questions of every row's ends read (and so write) 0.0 expectations the
    # cells' planner does not ask for: the same values wherever either has a key
    for a, b in zip(got[1], want[1]):
        assert {k: v for k, v in a.items() if v or k in b} == b

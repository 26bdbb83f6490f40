"""end_sums.end_sums (a point-to-point plan's bytes summed per device first, once for
its expected demand and its charge) against the row-by-row sums it replaces
(end_sums.row_sums: numpy.bincount of every row, host-crossing rows by their NICs):
bit-equal sums and the same touched indices, on clusters of one and several NICs a
host, rows within a host, zero-byte rows, devices not in the cluster, and totals at
2**53 (summed row by row there)."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.planner.cells.whole_sums import EXACT
from reshard.planner.schedule.end_sums import end_sums, row_sums


def _cluster(rng, devices, per_host, nics_per_host):
    host = np.arange(devices) // per_host
    nic = host * nics_per_host + (np.arange(devices) % per_host) % nics_per_host
    gone = rng.integers(0, devices, devices // 10)  # indices that are no device: 0, 0
    host[gone], nic[gone] = 0, 0
    return host.astype(np.int64), nic.astype(np.int64)


def _same(got, want):
    for a, b in zip((got.dev_out, got.dev_in, got.nic_out, got.nic_in),
                    (want.dev_out, want.dev_in, want.nic_out, want.nic_in)):
        touched = np.flatnonzero(b)
        assert np.array_equal(np.flatnonzero(a), touched)
        assert a[touched].tobytes() == b[touched].tobytes()


@pytest.mark.parametrize("seed,per_host,nics,big", [
    (0, 8, 1, False), (1, 8, 4, False), (2, 4, 2, True), (3, 1, 1, False),
    (4, 16, 8, True), (5, 8, 2, False)])
def test_per_device_sums_are_the_row_sums(seed, per_host, nics, big):
    rng = np.random.default_rng(seed)
    devices = 128
    host, nic = _cluster(rng, devices, per_host, nics)
    n = 5000
    root = rng.integers(0, devices, n)
    recv = rng.integers(0, devices, n)
    top = (1 << 40) if big else 1 << 20
    nbytes = rng.integers(0, top, n) * rng.integers(0, 2, n)  # some rows of 0 bytes
    _same(end_sums(root, recv, nbytes, host, nic), row_sums(root, recv, nbytes, host, nic))


def test_totals_from_2_53_are_summed_row_by_row():
    rng = np.random.default_rng(9)
    host, nic = _cluster(rng, 64, 8, 2)
    root, recv = rng.integers(0, 64, 3000), rng.integers(0, 64, 3000)
    nbytes = rng.integers(1 << 38, 1 << 42, 3000)
    nbytes[7] = EXACT  # the total not below 2**53: fractions of rounding per order
    nbytes[8:20] = 3 + EXACT // 3
    _same(end_sums(root, recv, nbytes, host, nic), row_sums(root, recv, nbytes, host, nic))
    nbytes = np.full(3000, EXACT // 3000 + 1)  # each small, together over
    _same(end_sums(root, recv, nbytes, host, nic), row_sums(root, recv, nbytes, host, nic))
    nbytes = rng.integers(1, 1 << 20, 3000)
    nbytes[::2] = -nbytes[::2] - EXACT  # negative counts (none in a plan): row by row too
    nbytes[1::2] += EXACT
    _same(end_sums(root, recv, nbytes, host, nic), row_sums(root, recv, nbytes, host, nic))


def test_no_rows_sum_to_nothing():
    host, nic = np.zeros(4, np.int64), np.zeros(4, np.int64)
    none = np.zeros(0, np.int64)
    got = end_sums(none, none, none, host, nic)
    assert not any(np.flatnonzero(s).size for s in (got.dev_out, got.dev_in, got.nic_out,
                                                     got.nic_in))


def test_a_plans_expected_demand_and_charges_are_the_rows_one_by_one():
    """WorkList.plan of an all-to-all table (every row point to point, expected demand
    first): its loads and expectations against each row charged and expected in turn."""
    import dataclasses

    from reshard.layout import chunk_bounds
    from reshard.planner.cells import cell_tasks
    from reshard.planner.cells.balance import Loads
    from reshard.planner.cells.decompose import decompose_table
    from reshard.planner.schedule.work import WorkList
    from reshard.planner.values.resources import NIC_IN, NIC_OUT
    from tests.unit._regular_clusters import regular_clusters

    for nics in (1, 2):
        cluster = dataclasses.replace(regular_clusters(6, 8)["two-nics"], nics_per_host=nics)
        src = [d for h in (0, 1, 2) for d in cluster.hosts[h]]
        dst = [d for h in (3, 4, 5) for d in cluster.hosts[h]]
        shape = (67, 41)
        holders = {((*chunk_bounds(67, len(src), i),), (0, 41)): frozenset({d})
                   for i, d in enumerate(src)}
        needers = {((0, 67), (*chunk_bounds(41, len(dst), i),)): frozenset({d})
                   for i, d in enumerate(dst)}
        table = decompose_table(shape, holders, needers)
        loads = Loads(cluster)
        wl = WorkList(cluster, loads)
        wl.add_table(0, table, 2, np.zeros(len(table), np.int64), None)
        wl.plan(cell_tasks.plan_broadcast, [2], expect=True, relays=False)
        p2p = wl.point_to_point()
        assert len(p2p.root) > 100 and not wl._planned.general
        want = Loads(cluster)
        for a, b, nb in zip(p2p.root.tolist(), p2p.recv.tolist(), p2p.nbytes.tolist()):
            want.charge(a, (b,), nb)
            if cluster.host_of(a) != cluster.host_of(b):
                want.expected[(NIC_OUT, cluster.nic_of(a))] += nb
                want.expected[(NIC_IN, cluster.nic_of(b))] += nb
        for name in ("nic_out", "nic_in", "dev_out", "dev_in", "expected"):
            got_t, want_t = dict(getattr(loads, name)), dict(getattr(want, name))
            assert {k: v for k, v in got_t.items() if v} == \
                {k: v for k, v in want_t.items() if v}, name


def test_a_work_list_sums_other_rows_anew():
    from reshard.planner.cells.balance import Loads
    from reshard.planner.schedule.work import WorkList
    from tests.unit._regular_clusters import regular_clusters

    cluster = regular_clusters(4, 8)["two-nics"]
    wl = WorkList(cluster, Loads(cluster))
    rng = np.random.default_rng(3)
    root, recv = rng.integers(0, 32, 200), rng.integers(0, 32, 200)
    nbytes = rng.integers(1, 999, 200)
    first = wl.end_sums(root, recv, nbytes)
    assert wl.end_sums(root, recv, nbytes) is first
    for args in ((root[::-1], recv, nbytes), (root, recv[::-1], nbytes),
                 (root, recv, nbytes[::-1])):
        wl.end_sums(root, recv, nbytes)  # the first rows last asked: each array apart
        again = wl.end_sums(*args)
        _same(again, row_sums(*args, wl._host, wl._nic))

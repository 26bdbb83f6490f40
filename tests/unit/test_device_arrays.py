"""schedule.device_arrays (each device's host and NIC as arrays, one builder for the work
list's and the kept rows') against Cluster.host_of / nic_of on regular clusters, one of
sparse shuffled ids and one of one device, with either fill; and why the work list fills
0: end_sums bins its whole NIC array, which a fill of -1 would make it refuse."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.cluster import Cluster
from reshard.planner.cells.balance import Loads
from reshard.planner.schedule.device_arrays import device_arrays
from reshard.planner.schedule.end_sums import end_sums, row_sums
from reshard.planner.schedule.work import WorkList
from tests.unit._regular_clusters import regular_clusters


def _sparse():
    ids = list(range(1, 200, 3))
    random.Random(2).shuffle(ids)
    return Cluster(tuple(tuple(ids[h * 6:h * 6 + 6]) for h in range(8)), nics_per_host=2)


CLUSTERS = [*regular_clusters(3, 8).values(), _sparse(), Cluster(((5,),))]


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("fill", [0, -1, 7])
def test_device_arrays_are_the_cluster_s(cluster, fill):
    host, nic = device_arrays(cluster, fill)
    size = max(cluster.devices) + 1
    assert host.dtype == nic.dtype == np.int64 and len(host) == len(nic) == size
    for d in range(size):
        if d in cluster.host_map:
            assert (host[d], nic[d]) == (cluster.host_of(d), cluster.nic_of(d))
        else:
            assert host[d] == nic[d] == fill


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_the_work_list_s_arrays_fill_0(cluster):
    wl = WorkList(cluster, Loads(cluster))
    host, nic = device_arrays(cluster, 0)
    assert np.array_equal(wl._host, host) and np.array_equal(wl._nic, nic)


def test_end_sums_needs_no_negative_fill():
    """On sparse ids, end_sums over the arrays filled 0 is the row sums; filled -1 it
    refuses them (numpy.bincount of the whole NIC array)."""
    cluster = _sparse()
    devices = np.array(cluster.devices, dtype=np.int64)
    rng = np.random.default_rng(0)
    root, recv = rng.choice(devices, 300), rng.choice(devices, 300)
    nbytes = rng.integers(1, 1 << 20, 300)
    got = end_sums(root, recv, nbytes, *device_arrays(cluster, 0))
    want = row_sums(root, recv, nbytes, *device_arrays(cluster, 0))
    for a, b in zip((got.dev_out, got.dev_in, got.nic_out, got.nic_in),
                    (want.dev_out, want.dev_in, want.nic_out, want.nic_in)):
        touched = np.flatnonzero(b)
        assert np.array_equal(np.flatnonzero(a), touched)
        assert a[touched].tobytes() == b[touched].tobytes()
    with pytest.raises(ValueError):
        end_sums(root, recv, nbytes, *device_arrays(cluster, -1))


@pytest.mark.parametrize("cluster", CLUSTERS[:2] + CLUSTERS[-2:])
def test_a_cut_s_work_lists_share_its_arrays_built_as_their_own(cluster):
    """cut_cells builds the arrays once (fill 0); every strategy's work list of the cut
    reads those very arrays, the values a work list builds for itself."""
    from reshard import DeviceMesh, Layout
    from reshard.planner.cuts import cut_cells, cut_slices
    from reshard.planner.values.request import make_tensor_spec
    from reshard.planner.values.strategy import Strategy

    devices = sorted(cluster.devices)
    src = Layout(DeviceMesh((len(devices),), devices), "S0R")
    dst = Layout(DeviceMesh((len(devices),), devices[::-1]), "RS0")
    t = make_tensor_spec((len(devices) * 4, 8), "float32", src, dst, cluster)
    cut = cut_cells((t,), cluster)
    host, nic = device_arrays(cluster, 0)
    assert np.array_equal(cut.devices[0], host) and np.array_equal(cut.devices[1], nic)
    for strat in Strategy:
        work = cut_slices((t,), cluster, strat, cut=cut).work
        assert work._host is cut.devices[0] and work._nic is cut.devices[1]

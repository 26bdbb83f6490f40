"""Each device's host and NIC as arrays indexed by device id, read from a cluster's maps.

A work list (:mod:`reshard.planner.schedule.work`), a table's kept rows
(:mod:`reshard.planner.schedule.kept_rows`) and the routes' hops read a device's host
and NIC in bulk, indexing these arrays with the devices of a plan's tasks: every such
index is a device of the cluster. An id below the largest that names no device (a
cluster of sparse ids) holds ``fill``. Which fill a caller gives matters only to a
reader that reads every entry: :func:`~reshard.planner.schedule.end_sums.end_sums`
bins a work list's whole NIC array (:func:`numpy.bincount`, which refuses a negative
entry; its weight there is 0, so a fill of 0 adds nothing), so the work list fills 0;
a reader that only indexes by devices may fill -1 (no device)."""

from __future__ import annotations

import numpy as np

from reshard.cluster import Cluster

DeviceArrays = tuple[np.ndarray, np.ndarray]
"""Each device's host and NIC (:func:`device_arrays`)."""


def device_arrays(cluster: Cluster, fill: int) -> DeviceArrays:
    """Each device's host and NIC (:meth:`Cluster.host_of`, :meth:`Cluster.nic_of`),
    int64, indexed by device id up to the largest; ``fill`` at an id that names no
    device."""
    hosts, nics = cluster.host_map, cluster.nic_map
    n = len(hosts)
    size = max(hosts, default=-1) + 1
    host, nic = np.full(size, fill, dtype=np.int64), np.full(size, fill, dtype=np.int64)
    devices = np.fromiter(hosts, dtype=np.int64, count=n)
    host[devices] = np.fromiter(hosts.values(), dtype=np.int64, count=n)
    nic[devices] = np.fromiter(map(nics.__getitem__, hosts), dtype=np.int64, count=n)
    return host, nic


__all__ = ["DeviceArrays", "device_arrays"]

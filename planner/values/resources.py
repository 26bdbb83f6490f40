"""The resources a transfer uses, named once for the balancer and the cost model.

A transfer leaves a host through its sending device's NIC (``NIC_OUT``) and enters the
next host through its receiving device's NIC (``NIC_IN``); inside a host it leaves a
device by ``DEV_OUT`` and enters one by ``DEV_IN``; a local copy uses the device's
``COPY`` engine; a cluster with ``Cluster.shared_bandwidth`` has one more, ``SHARED``
(index 0), that every byte moving between two devices crosses once. A resource is
``(kind, index)``: a NIC index (``Cluster.nic_of``), a device id, or 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reshard.cluster import Cluster

NIC_OUT = "nic_out"
NIC_IN = "nic_in"
DEV_OUT = "dev_out"
DEV_IN = "dev_in"
COPY = "copy"
SHARED = "shared"

Resource = tuple[str, int]

KINDS = (NIC_OUT, NIC_IN, DEV_OUT, DEV_IN, COPY, SHARED)
"""Every kind of resource, in the order of its code (:func:`code`)."""

KIND_CODE = {kind: i for i, kind in enumerate(KINDS)}
"""Each kind's place in :data:`KINDS`."""


def code(res: Resource) -> int:
    """One integer for a resource, ``index * 8 + `` its kind's place in :data:`KINDS`
    (numbered without a cluster; :func:`of_code` inverts it)."""
    return res[1] * 8 + KIND_CODE[res[0]]


def of_code(c: int) -> Resource:
    """The resource :func:`code` numbered ``c``."""
    return KINDS[c % 8], c // 8

_CAPACITY: dict[str, Callable[[Cluster], float]] = {
    NIC_OUT: lambda c: c.nic_capacity,
    NIC_IN: lambda c: c.nic_capacity,
    DEV_OUT: lambda c: c.intra_bandwidth,
    DEV_IN: lambda c: c.intra_bandwidth,
    COPY: lambda c: c.copy_bandwidth,
    SHARED: lambda c: c.shared_bandwidth,
}


def capacity(res: Resource, cluster: Cluster) -> float:
    """Bytes per second of one resource of ``cluster``."""
    return _CAPACITY[res[0]](cluster)


def capacities(cluster: Cluster) -> dict[str, float]:
    """Bytes per second of a resource of each kind of ``cluster``."""
    return {kind: of(cluster) for kind, of in _CAPACITY.items()}


def crossings(host: Callable[[int], int], root: int,
              chain: Sequence[int]) -> list[tuple[int, int]]:
    """The host boundaries a pipelined chain ``root -> chain[0] -> chain[1] ...``
    crosses, as (sending device, receiving device) pairs, in chain order.

    Args:
        host: the host of a device (a plain lookup: this is on the planner's hot path).
        root: the device the chain starts at.
        chain: the devices it passes through, in order.
    """
    out = []
    prev, prev_host = root, host(root)
    for d in chain:
        h = host(d)
        if h != prev_host:
            out.append((prev, d))
        prev, prev_host = d, h
    return out

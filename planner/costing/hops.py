"""A planning call's hops and the memos its routes share (issue 62).

:class:`Hops` keeps, for the routes of one cluster, each (sender, receiver) edge's hop
(:func:`~reshard.planner.costing.cost._hop`), the cluster's devices' hosts and NICs as
arrays, its host step where it is regular, and the memos of route forms, chains' host
ranks and read-only fractions the routes are numbered with. :func:`~reshard.planner.
costing.cost.task_routes` keeps one with its memo of routes, so every plan of a call
reads each of them once.
"""

from __future__ import annotations

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.costing.relabel_many import Packed
from reshard.planner.costing.route_forms import ChainMemo, FormMemo
from reshard.planner.schedule.device_arrays import device_arrays
from reshard.planner.values.resources import Resource

Hop = tuple[tuple[tuple[Resource, float], ...], float, float, tuple[int, ...]]
"""What one (sender, receiver) edge of a transfer crosses (:func:`~reshard.planner.
costing.cost._hop`)."""

SHIFT_HOSTS = 16
"""Hosts from which a cluster's routes are found once per host (:meth:`Hops.host_step`)."""


class Hops(dict[tuple[int, int], Hop]):
    """Hops by edge: the routes of one plan share them (a broadcast tree's edges recur
    across its tasks); and the cluster's devices' hosts and NICs as arrays (indexed by
    device, made once), which a task of many edges reads its hops from at once.
    :func:`~reshard.planner.costing.cost.task_routes` keeps one in its memo of routes
    (:func:`~reshard.planner.costing.cost.shared_hops`), so that
    every plan of a planning call reads each edge, the arrays and the host step once."""

    tables: tuple[np.ndarray, np.ndarray] | None = None
    cluster: Cluster | None = None
    step: tuple[tuple[int, int] | None] | None = None  # host_step, found once (in a 1-tuple)
    memo: FormMemo | None = None  # routes by form (forms())
    chain_memo: ChainMemo | None = None  # chains' host ranks (chains())
    ones_memo: dict[int, np.ndarray] | None = None  # read-only fractions by length (ones())
    packed_memo: Packed | None = None  # receivers' tuples packed (packed())

    def packed(self) -> Packed:
        """Large tasks' receivers' tuples packed as integers, by identity (:func:`~reshard.
        planner.costing.relabel_many.relabeled_many`), kept with the hops so every plan
        of a call packs each tuple once."""
        if self.packed_memo is None:
            self.packed_memo = {}
        return self.packed_memo

    def ones(self) -> dict[int, np.ndarray]:
        """Read-only fractions of 1.0 by length, shared by the routes
        :func:`~reshard.planner.costing.route_forms.relabeled` numbers back."""
        if self.ones_memo is None:
            self.ones_memo = {}
        return self.ones_memo

    def chains(self) -> ChainMemo:
        """Chains' host ranks (:func:`~reshard.planner.costing.route_forms.relabeled`),
        kept with the hops so every plan of a call shares them."""
        if self.chain_memo is None:
            self.chain_memo = {}
        return self.chain_memo

    def forms(self) -> FormMemo:
        """Routes by form on a regular cluster (:mod:`~reshard.planner.costing.
        route_forms`), kept with the hops so every plan of a call shares them."""
        if self.memo is None:
            self.memo = {}
        return self.memo

    def host_step(self, cluster: Cluster) -> tuple[int, int] | None:
        """Devices and NICs a host where ``cluster`` is regular (host ``h`` holds
        devices ``h * g ... h * g + g - 1``, its NICs numbered ``h * n`` on in the same
        way for every host, no shared bandwidth), so that moving a transfer by whole
        hosts moves its resources by whole hosts, and has :data:`SHIFT_HOSTS` hosts or
        more (fewer have few twins to find); else None."""
        hosts = cluster.hosts
        if cluster.shared_bandwidth or len(hosts) < SHIFT_HOSTS or not hosts[0]:
            return None
        host, nic = self.arrays(cluster)
        g, n = len(hosts[0]), cluster.nics_per_host
        d = np.arange(len(host))
        if not (np.array_equal(host, d // g)
                and np.array_equal(nic, (d // g) * n + nic[d % g])):
            return None
        return g, n

    def arrays(self, cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
        """Each device's host and NIC on ``cluster`` (-1: no device)."""
        if self.tables is None:
            self.tables = device_arrays(cluster, -1)
        return self.tables


__all__ = ["SHIFT_HOSTS", "Hop", "Hops"]

"""Two equal ``Loads`` of one cluster, for tests that run a fast path on one and the
path it replaces on the other (tests only)."""

from __future__ import annotations

import random

from reshard.cluster import Cluster
from reshard.planner.cells import balance


def twin_loads(rng: random.Random, cluster: Cluster, crowded: bool
               ) -> tuple[balance.Loads, balance.Loads]:
    """Two ``Loads`` of ``cluster`` given the same NIC loads, drawn from a few levels
    (so they tie), and, ``crowded``, the same uneven expectations (some NICs may relay)."""
    twins = balance.Loads(cluster), balance.Loads(cluster)
    devices = list(cluster.devices)
    for _ in range(12 if crowded else 0):
        holders = frozenset(rng.sample(devices, rng.randint(1, 2)))
        needers = frozenset(rng.sample(devices, rng.randint(2, 9)))
        nbytes = rng.choice([1000, 70000])
        for loads in twins:
            loads.expect(holders, needers - holders, nbytes)
    for n in range(len(devices)):
        out, into = float(rng.choice([0, 0, 1, 2, 5]) << 20), float(rng.choice([0, 1, 3]) << 20)
        for loads in twins:
            loads.nic_out[n], loads.nic_in[n] = out, into
    return twins

"""A work list's expected NIC demand, each distinct cell worked out once: the same sums,
bit for bit and key for key, as calling ``Loads.expect`` for every cell."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.cells.balance import Loads
from reshard.planner.schedule.work import _Demand


@pytest.mark.parametrize("cluster", [Cluster.preset("dgx-h100", 4),
                                     Cluster.regular(3, 4, nic_bandwidth=1e9,
                                                     shared_bandwidth=5e9)],
                         ids=["dgx-h100x4", "shared"])
def test_replayed_demand_equals_expect_for_every_cell(cluster):
    rng = random.Random(7)
    devices = list(cluster.devices)
    shapes = []
    for _ in range(12):
        holders = frozenset(rng.sample(devices, rng.randint(1, 5)))
        needers = frozenset(rng.sample(devices, rng.randint(1, len(devices))))
        shapes.append((holders, needers, rng.choice([3, 1000, 12345, 1 << 20])))
    cells = [rng.choice(shapes) for _ in range(300)]  # most repeat some earlier cell
    direct, replayed = Loads(cluster), Loads(cluster)
    demand = _Demand(replayed)
    for holders, needers, nbytes in cells:
        direct.expect(holders, needers - holders, nbytes)
        demand.expect(holders, needers, nbytes)
    assert list(replayed.expected.items()) == list(direct.expected.items())
    assert replayed.shared == direct.shared
    assert len(demand.known) <= len(shapes) < len(cells)
    if cluster.shared_bandwidth:
        assert direct.shared > 0

"""A cell's bytes into each needing host counted by one ``dict.update`` (issue 62,
round eighteen): :meth:`bound._Intake._host_in` leaves every count the per-host loop
left, key by key in the same order, and the same bound, bit for bit (bytes whose sums
depend on their order; sums and plain cells; hosts new and seen)."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.costing import bound
from tests.unit.test_bound_needs import _counts


def _loop(self, needers, needs, hold_hosts, summing, size, nbytes):
    """The old way: the hosts' counts one by one, then each one's least."""
    summed = size > 0
    hosts = needs.host_set - summing
    for h in hosts:
        self.host_in[h] = self.host_in.get(h, 0.0) + nbytes
    key = (needers, size, hold_hosts) if summed else needers
    taken = self.least_taken.get(key)
    if taken is None:
        taken = self.least_taken[key] = set()
    elif taken >= hosts:
        return
    for h in hosts:
        adds = size if summed and h not in hold_hosts else 1
        spread = needs.per_host[h]
        least = self.host_least.get(h, (adds, spread))
        self.host_least[h] = (min(least[0], adds), min(least[1], spread))
    taken.update(hosts)


@pytest.mark.parametrize("seed", range(8))
def test_hosts_count_a_cell_as_the_loop_does(seed, monkeypatch):
    rng = random.Random(seed)
    cluster = Cluster.preset("dgx-h100", 12)
    devices = sorted(cluster.host_map)
    sets = [frozenset(rng.sample(devices, rng.randint(1, 60))) for _ in range(5)]
    sizes = [0.1, 1e17 / 3, 3, 12345.5, 7e6 / 7, 2.0 ** 60 + 1]
    cells = []
    for _ in range(150):
        needers = rng.choice(sets)
        holders = frozenset(rng.sample(devices, rng.randint(1, 3)))
        size = rng.choice([0, 0, 2, 3, 8])
        cells.append((holders, needers, rng.choice(sizes), size))
    fast, slow = bound._Intake(cluster), bound._Intake(cluster)
    for holders, needers, nbytes, size in cells:
        fast._cell(holders, needers, nbytes, size, set())
    monkeypatch.setattr(bound._Intake, "_host_in", _loop)
    for holders, needers, nbytes, size in cells:
        slow._cell(holders, needers, nbytes, size, set())
    assert _counts(fast) == _counts(slow)
    assert list(fast.host_in.items()) == list(slow.host_in.items())

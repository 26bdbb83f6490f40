"""A reduction's shares gathered in bulk (planner/cells/gather_shares.py): every load
ends bit-equal to gathering the shares one by one with gather_shares.gather (Loads.gather as was)."""

from __future__ import annotations

import random

from reshard import Cluster
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.gather_shares import gather, gather_shares


def _loads(cluster: Cluster, rng: random.Random, mode: int) -> Loads:
    """Loads of whole bytes (mode 0), some not whole (1), or near 2**53 (2: sums
    rounded, one by one otherwise than at once)."""
    loads = Loads(cluster)
    for table in (loads.dev_out, loads.dev_in, loads.nic_out, loads.nic_in):
        for key in rng.sample(range(32), 10):
            table[key] = (float(rng.randint(0, 1 << 30)),
                          rng.randint(0, 1 << 30) + 0.3,
                          float((1 << 53) - rng.randint(0, 1 << 20)))[mode]
    return loads


def _tables(loads: Loads) -> list[dict[int, float]]:
    return [{k: v for k, v in t.items() if v}
            for t in (loads.dev_out, loads.dev_in, loads.nic_out, loads.nic_in)]


def test_bulk_gather_equals_gathering_each_share_on_random_groups():
    cluster = Cluster.preset("aws-p4d.24xlarge", 4)  # 4 hosts, 2 devices per NIC
    rng = random.Random(62)
    for trial in range(300):
        mode = (0, 0, 0, 1, 2)[trial % 5]  # modes 1, 2: the one-by-one path
        seed = rng.random()
        group = tuple(rng.sample(range(32), rng.randint(2, 32)))
        shares = [(rng.choice(group), rng.randint(1, 1 << 24) | 1)
                  for _ in range(rng.randint(1, 40))]
        one, bulk = (_loads(cluster, random.Random(seed), mode) for _ in range(2))
        for root, nbytes in shares:
            gather(one, tuple(d for d in group if d != root), root, nbytes)
        gather_shares(bulk, group, shares)
        assert _tables(bulk) == _tables(one)


def test_a_roots_addends_by_slicing_equal_filtering():
    from reshard.planner.cells.reduce import _others

    rng = random.Random(7)
    for _ in range(500):
        group = tuple(rng.choice(range(12)) for _ in range(rng.randint(1, 10)))
        root = rng.randrange(14)  # sometimes absent, sometimes repeated in the group
        assert _others(group, root) == tuple(d for d in group if d != root)

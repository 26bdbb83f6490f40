"""The chain memo's readers found once per touched host set (planner/cells/balance.py,
issue 62 round seven): every remembered chain reads the loads of exactly the NICs of
the hosts its root and receivers touch, in NIC order, as the reader found for that
chain alone did; chains sharing the hosts share the reader."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.cells.balance import Loads

CLUSTERS = [Cluster.preset("dgx-h100", 6), Cluster.preset("aws-p4d.24xlarge", 4)]


@pytest.mark.parametrize("cluster", CLUSTERS, ids=["dgx-h100", "p4d"])
def test_each_remembered_chain_reads_its_touched_hosts_nics(cluster):
    rng = random.Random(5)
    loads = Loads(cluster)
    devices = list(cluster.devices)
    roots = [rng.choice(devices) for _ in range(15)]
    # a receiver on the root's host too (short chains to other hosts only are
    # answered before the memo is asked)
    groups = [tuple(sorted({*rng.sample(devices, rng.randint(2, 12)),
                            next(d for d in cluster.hosts[cluster.host_of(r)] if d != r)}))
              for r in roots]
    for _ in range(4):  # each asked several times: readers made from the second
        for root, group in zip(roots, groups):
            receivers = tuple(d for d in group if d != root)
            if len(receivers) > 1:
                loads.relay_chain(root, receivers, 1 << 20)
    memo = loads._chains
    table = {n: float(rng.randrange(1000)) for n in range(4 * len(devices))}
    read = 0
    for (root, members), (reader, _) in memo.chains.items():
        if reader is None:
            continue
        touched = {cluster.host_of(root), *map(cluster.host_of, members)}
        nics = sorted({cluster.nic_of(d) for h in touched for d in cluster.hosts[h]})
        assert reader(table) == tuple(table[n] for n in nics)
        read += 1
    assert read >= 10
    assert len(memo.readers) < read  # chains over the same hosts share a reader

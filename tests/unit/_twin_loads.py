"""Two equal ``Loads`` of one cluster, for tests that run a fast path on one and the
path it replaces on the other, and the check that both are left the same (tests only)."""

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


def load_tables(loads: balance.Loads) -> list[dict[object, float]]:
    """``loads``' NIC and device loads and expectations, as plain dicts."""
    return [dict(getattr(loads, name))
            for name in ("nic_out", "nic_in", "dev_out", "dev_in", "expected")]


def assert_same_loads(a: balance.Loads, b: balance.Loads, expected_order: bool) -> None:
    """``a`` and ``b`` left the same: every load and expectation, the loads' keys in
    the same order (iterations read it), the relay answers, shared bytes, epoch and
    moved bytes; ``expected_order``: the expectations' keys in the same order too (a
    path that reads fewer unseen keys of that defaultdict may add them in another
    order, which nothing reads: the planner only looks expectations up by key)."""
    ta, tb = load_tables(a), load_tables(b)
    assert ta == tb
    keep = len(ta) if expected_order else len(ta) - 1
    assert [list(t) for t in ta[:keep]] == [list(t) for t in tb[:keep]]
    assert (a._may_relay, a.shared, a._epoch, dict(a.moved)) == \
        (b._may_relay, b.shared, b._epoch, dict(b.moved))

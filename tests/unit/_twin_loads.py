"""Two equal ``Loads`` of one cluster, for tests that run a fast path on one and the
path it replaces on the other, and the check that both are left the same (tests only)."""

from __future__ import annotations

import random

from reshard.cluster import Cluster
from reshard.planner.cells import balance
from reshard.planner.cells.decompose import Cell


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


def expect_cells(rng: random.Random, cluster: Cluster, n: int, *, mixed: bool = False,
                 fresh: bool = False) -> tuple[list[Cell], list[int]]:
    """``n`` one-holder cells (a row each) to one of four needer sets (three within a
    host, one over several), for runs of expectations; ``mixed``: some of two holders
    and some of 1,000 bytes; ``fresh``: every set a new object (equal by value only)."""
    devices = list(cluster.devices)
    hosts = cluster.hosts
    sets = [frozenset(rng.sample(hosts[h], rng.randint(2, len(hosts[h]))))
            for h in rng.sample(range(len(hosts)), 3)]
    sets.append(frozenset(rng.sample(devices, 12)))  # several hosts
    cells, nbytes = [], []
    for k in range(n):
        needers = rng.choice(sets)
        holders = frozenset({rng.choice([d for d in devices if d not in needers])})
        if mixed and rng.random() < 0.05:
            holders = frozenset(rng.sample(devices, 2))
        if fresh:
            holders, needers = frozenset(set(holders)), frozenset(set(needers))
        cells.append(Cell(((0, 1), (k, k + 1)), holders, needers))
        nbytes.append(rng.choice([0, 840, 840 * 16, 840 * 3] + [1000] * mixed))  # 840: 1..8
    return cells, nbytes

"""A holder set read once and the root among many holders picked by arrays
(planner/cells/holder_arrays.py, issue 62 round nine): the root the loop over every
holder picks, on loads that tie at every part of its key, the tables left as the loop
leaves them (it declines until the loop has read every holder in); and a slice's
demand with its holders' hosts and NICs remembered, the demand found afresh."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.cells import balance
from tests.unit._twin_loads import twin_loads

CLUSTER = Cluster.preset("dgx-h100", 24)


def _old_pick_root(loads, holders, needer_hosts, nbytes):
    """:meth:`Loads.pick_root` as it was: the least key over every holder."""
    if len(holders) == 1:
        return next(iter(holders))
    best_key, best = None, -1
    for d in holders:
        h = loads.host(d)
        remote = len(needer_hosts) > 1 or h not in needer_hosts
        key = (loads.nic_out[loads.nic(d)] + (nbytes if remote else 0), h not in needer_hosts,
               loads.dev_out[d], d)
        if best_key is None or key < best_key:
            best_key, best = key, d
    return best


def _tables(loads):
    return [list(getattr(loads, name).items()) for name in ("nic_out", "dev_out")]


@pytest.mark.parametrize("seed", range(5))
def test_a_root_among_many_holders_by_arrays_is_the_loop_s(seed):
    rng = random.Random(seed)
    fresh = seed % 2 == 0  # tables without the holders yet: the loop reads them in
    if fresh:
        loads, twin = balance.Loads(CLUSTER), balance.Loads(CLUSTER)
    else:
        loads, twin = twin_loads(rng, CLUSTER, crowded=False)
    devices = list(CLUSTER.devices)
    sets = [frozenset(rng.sample(devices, k)) for k in (64, 80, 191)] + [frozenset(devices)]
    picked = set()
    for _ in range(150):
        holders = rng.choice(sets)
        needer_hosts = set(rng.sample(range(24), rng.choice([0, 1, 1, 1, 2, 5])))
        nbytes = rng.choice([0, 1 << 20, 3 << 20])
        got = loads.pick_root(holders, needer_hosts, nbytes)
        want = _old_pick_root(twin, holders, needer_hosts, nbytes)
        assert got == want
        picked.add(got)
        assert _tables(loads) == _tables(twin)
        # the pick sends: loads move, and tie (few levels of bytes)
        for tab in (loads, twin):
            tab.dev_out[got] += nbytes
            tab.nic_out[tab.nic(got)] += nbytes
    assert len(picked) > 10


def _old_demand(host, nic, shared_bandwidth, holders, needers, nbytes):
    """:func:`balance.slice_demand` as it was: its holders' hosts and NICs found per call."""
    shared = float(nbytes * len(needers - holders)) if shared_bandwidth else 0.0
    if len(holders) == 1 and len(needers) == 1:
        (a,), (b,) = holders, needers
        if host(a) == host(b):
            return [], shared
        return [((balance.NIC_OUT, nic(a)), nbytes), ((balance.NIC_IN, nic(b)), nbytes)], shared
    sides = balance._sides(host, nic, needers)
    held = sides[2].intersection({host(d) for d in holders})
    into, entries = balance._entering(host, nic, needers, sides, held, nbytes)
    if not into:
        return [], shared
    out = {nic(d) for d in holders}
    return [((balance.NIC_OUT, n), nbytes * into / len(out)) for n in out] + entries, shared


@pytest.mark.parametrize("seed", range(3))
def test_a_slice_s_demand_with_its_holders_remembered_is_the_demand_afresh(seed):
    rng = random.Random(seed)
    devices = list(CLUSTER.devices)
    memo = balance.NeederMemo()
    host, nic = balance.Loads(CLUSTER).host, balance.Loads(CLUSTER).nic
    sets = [frozenset(rng.sample(devices, k)) for k in (2, 9, 64, 150)]
    sets.append(frozenset(range(40, 48)))  # one host, among the needers' or not
    for _ in range(80):
        holders = rng.choice(sets)
        needers = frozenset(rng.sample(devices, rng.choice([2, 9, 70])))
        nbytes = rng.choice([1000, 1 << 20])
        got = balance.slice_demand(host, nic, seed == 1, holders, needers, nbytes, memo)
        want = _old_demand(host, nic, seed == 1, holders, needers, nbytes)
        assert got == want
    assert len(memo.holders) == len(sets)

"""A long chain's receiver list read once (chain_arrays.Receivers) and its NIC charges
found by arrays (chain_arrays.charge_crossings), issue 62 round nine: the same chain
order, host by host, as the sorts over every member, asked again and again for the same
receivers while the loads change; the same loads, in the same key order, as the charge
walked member by member."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from reshard import Cluster
from reshard.planner.cells import balance, chain_arrays
from tests.unit._twin_loads import twin_loads

CLUSTER = Cluster.preset("dgx-h100", 24)  # a NIC per device


def _old_order(loads, root, receivers):
    """:func:`chain_arrays._order` as it was: a minimum and a sort over every member."""
    d = np.array(receivers, dtype=np.int64)
    n = len(d)
    hosts = np.fromiter(map(loads.host, receivers), dtype=np.int64, count=n)
    nics = list(map(loads.nic, receivers))
    zero = itertools.repeat(0.0)
    sent = np.fromiter(map(loads.nic_out.get, nics, zero), dtype=np.float64, count=n)
    got = np.fromiter(map(loads.nic_in.get, nics, zero), dtype=np.float64, count=n)
    rh = loads.host(root)
    local = hosts == rh
    distinct, at = np.unique(hosts, return_inverse=True)
    at = at.reshape(-1)
    least = np.full(len(distinct), np.inf)
    np.minimum.at(least, at, sent)
    remote = distinct != rh
    by_load = np.lexsort((distinct[remote], least[remote]))
    rank = np.full(len(distinct), -1, dtype=np.int64)
    rank[np.flatnonzero(remote)[by_load]] = np.arange(len(by_load))
    last = len(by_load) - 1
    pick = np.lexsort((d, got, at))
    entry = np.zeros(len(d), dtype=bool)
    first_of = np.ones(len(d), dtype=bool)
    first_of[1:] = at[pick][1:] != at[pick][:-1]
    entry[pick[first_of]] = True
    entry &= ~local
    r = rank[at]
    by_out = (local & (last >= 0)) | (~local & ~entry & (r < last))
    key = np.where(by_out, -sent, 0.0)
    order = np.lexsort((d, key, ~entry, r))
    return d[order], hosts[order], sent[order]


def _old_charge(loads, root, chain, nbytes):
    """:meth:`Loads.charge` of a chain of several, member by member, as it was."""
    loads.dev_out[root] += nbytes
    for r in chain:
        loads.dev_in[r] += nbytes
    prev, prev_host = root, loads.host(root)
    for d in chain:
        h = loads.host(d)
        if h != prev_host:
            loads.nic_out[loads.nic(prev)] += nbytes
            loads.nic_in[loads.nic(d)] += nbytes
            prev_host = h
        prev = d


def _tables(loads):
    return [list(getattr(loads, name).items())
            for name in ("nic_out", "nic_in", "dev_out", "dev_in")]


@pytest.mark.parametrize("seed", range(4))
def test_orders_of_receivers_read_once_are_the_sorts_over_every_member(seed):
    rng = random.Random(seed)
    loads, twin = twin_loads(rng, CLUSTER, crowded=False)
    devices = list(CLUSTER.devices)
    lists = [sorted(rng.sample(devices, k)) for k in (64, 100, 190)]
    lists.append(sorted(set(range(8, 120)) - {9, 17}))  # hosts of uneven sizes
    asked: set[tuple[int, ...]] = set()
    for _ in range(60):
        receivers = rng.choice(lists)
        root = rng.choice(devices)  # on one of the receivers' hosts, or on none
        mine = [r for r in receivers if r != root]
        asked.add(tuple(mine))
        got = chain_arrays._order(loads, root, mine)
        want = _old_order(twin, root, mine)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        chain = tuple(got[0].tolist())
        nbytes = rng.choice([1 << 20, 3 << 20])
        loads.charge(root, chain, nbytes)  # the loads move (ties come and go)
        _old_charge(twin, root, chain, nbytes)
        assert _tables(loads) == _tables(twin)
    assert len(loads.receiver_memo) == len(asked) < 60  # lists asked again, read once


@pytest.mark.parametrize("seed", range(3))
def test_a_long_chain_s_charge_by_arrays_is_the_walk_member_by_member(seed):
    rng = random.Random(seed)
    loads, twin = twin_loads(rng, CLUSTER, crowded=False)
    devices = list(CLUSTER.devices)
    crossed = 0
    for _ in range(30):
        chain = tuple(rng.sample(devices, rng.choice([64, 90, 191])))
        if rng.random() < 0.3:  # host by host, the root's first
            chain = tuple(sorted(chain, key=lambda d: (d // 8, d)))
        root = rng.choice([d for d in devices if d not in chain] or [chain[0]])
        if root in chain:
            continue
        nbytes = rng.choice([1000, 1 << 20])
        loads.charge(root, chain, nbytes)
        _old_charge(twin, root, chain, nbytes)
        crossed += sum(1 for a, b in zip((root, *chain), chain) if a // 8 != b // 8)
        assert _tables(loads) == _tables(twin)
    assert crossed and len(chain) >= balance.ARRAY_CHAIN


WIDE = Cluster.preset("dgx-h100", 48)


@pytest.mark.parametrize("seed", range(3))
def test_a_chain_s_crossings_noted_by_its_arrays_charge_as_the_walk(seed):
    """A long chain :meth:`Loads.relay_chain` answered by arrays (its crossings noted),
    charged: the same loads as the old charge member by member, roots on the
    receivers' hosts, on none of them and among them, two receivers a host (no member
    moves), a chain charged from another root on the same host or on its first
    member's, and an earlier chain
    (its own crossings not the ones noted last) charged again."""
    rng = random.Random(seed)
    loads, twin = twin_loads(rng, WIDE, crowded=False)
    devices = list(WIDE.devices)
    noted = 0
    earlier: list[tuple[int, tuple[int, ...]]] = []
    for _ in range(60):
        receivers = frozenset(rng.sample(devices, rng.choice([64, 100, 150])))
        if rng.random() < 0.3:  # two a host
            receivers = frozenset(d for d in devices if d % 8 in (3, 6))
        root = rng.choice(devices)
        chain, through = loads.relay_chain(root, receivers - {root}, 1 << 20)
        assert not through
        noted += loads.crossings is not None and loads.crossings[0] is chain
        earlier.append((root, chain))
        if rng.random() < 0.2:  # another root of the host, the chain's crossings kept
            root = root // 8 * 8 + (root + 1) % 8
            if root in chain:
                continue
        elif rng.random() < 0.3:  # a root on its first member's host: no crossing there
            root = next((d for d in range(chain[0] // 8 * 8, chain[0] // 8 * 8 + 8)
                         if d not in chain), root)
        if rng.random() < 0.2:  # another chain
            root, chain = rng.choice(earlier)
        nbytes = rng.choice([1000, 1 << 20])
        loads.charge(root, chain, nbytes)
        _old_charge(twin, root, chain, nbytes)
        assert _tables(loads) == _tables(twin)
    assert noted >= 30

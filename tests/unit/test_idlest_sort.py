"""A long chain's idlest-last moves folded into its one sort (chain_arrays._order with
``idlest``, unrelayed_chain), issue 62 round eleven: the same chain, the same crossings
noted, the same relay questions asked in the same order (the same cache left) and the
same mirror order as the two sorts it replaces (``_two_sorts`` below, round ten's
unrelayed_chain, kept as the oracle), on load tables whose values tie (many hosts'
least loads equal), with NaNs and infinities, the root's host among the receivers' or
not, hosts of one to eight receivers, and crowded expectations (some boundary may
relay: None from both)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard import Cluster
from reshard.planner.cells import chain_arrays
from reshard.planner.values.resources import NIC_IN, NIC_OUT
from tests.unit._twin_loads import twin_loads

CLUSTER = Cluster.preset("dgx-h100", 24)


def _two_sorts(loads, root, receivers):
    """Round ten's unrelayed_chain: the chain sorted, then each segment's idlest member
    moved last by a second sort; the walk's questions of the chain before the moves."""
    d, h, sent, _ = chain_arrays._order(loads, root, receivers)
    mirror = loads.nic_mirror
    order = mirror.order if mirror is not None else None
    n = len(d)
    rh = loads.host(root)
    start = np.ones(n, dtype=bool)
    start[1:] = h[1:] != h[:-1]
    entries = np.flatnonzero(start & (h != rh))
    if not entries.size:
        return chain_arrays._noted(loads, tuple(d.tolist()), rh, [], order)
    leaving = d[entries - 1] if entries[0] else \
        np.concatenate((np.array([root], dtype=np.int64), d[entries[1:] - 1]))
    if chain_arrays.may_relay_any(loads, NIC_OUT, leaving) or \
            chain_arrays.may_relay_any(loads, NIC_IN, d[entries]):
        return None
    seg = np.cumsum(start) - 1
    movable = (seg != seg[-1]) & ((h == rh) | ~start)
    count = np.bincount(seg[movable], minlength=int(seg[-1]) + 1)
    at = np.flatnonzero(movable & (count >= 2)[seg])
    if not at.size:
        return chain_arrays._noted(loads, tuple(d.tolist()), rh, entries.tolist(), order)
    by_key = at[np.lexsort((d[at], sent[at], seg[at]))]
    first = np.ones(len(by_key), dtype=bool)
    first[1:] = seg[by_key][1:] != seg[by_key][:-1]
    last = np.zeros(n, dtype=bool)
    last[by_key[first]] = True
    moved = np.lexsort((np.arange(n), last, seg))
    return chain_arrays._noted(loads, tuple(d[moved].tolist()), rh, entries.tolist(),
                               None if order is None else order[moved])


def _receivers(rng, root):
    """Many receivers: some hosts whole, some with one to seven members, the root's
    host's others among them or not."""
    hosts = rng.sample(range(24), rng.choice([9, 16, 23]))
    out = []
    for h in hosts:
        devs = CLUSTER.hosts[h]
        out += rng.sample(devs, rng.choice([1, 2, 3, 8, 8]))
    if rng.random() < 0.3:
        out += CLUSTER.hosts[root // 8]
    return sorted(set(out) - {root})


def _bend(rng, loads):
    """Some loads NaN, infinite or tied at the least value."""
    roll = rng.random()
    for _ in range(rng.randint(1, 6)):
        n = rng.randrange(24 * 8)
        if roll < 0.35:  # a few of one host's NICs: some tie as NaNs
            for m in rng.sample(range(n - n % 8, n - n % 8 + 8), rng.randint(1, 4)):
                loads.nic_out[m] = float("nan")
        elif roll < 0.25:
            loads.nic_out[n] = float("nan")
        elif roll < 0.4:
            loads.nic_out[n] = float("inf")
        elif roll < 0.5:
            loads.nic_out[n] = -0.0


@pytest.mark.parametrize("seed", range(8))
def test_the_moves_in_one_sort_are_the_two_sorts(seed):
    rng = random.Random(seed)
    moved = asked = none = bent = 0
    for trial in range(16):
        fold, two = twin_loads(rng, CLUSTER, crowded=trial % 4 == 3)
        if trial % 3 == 1:
            state = random.getstate()
            _bend(random.Random(trial), fold)
            _bend(random.Random(trial), two)
            random.setstate(state)
            bent += 1
        for k in range(4):
            root = rng.randrange(24 * 8)
            receivers = _receivers(rng, root)
            if len(receivers) < 2:
                continue
            mirrors = [chain_arrays.NicMirror(), chain_arrays.NicMirror()] if k % 2 else \
                [None, None]
            fold.nic_mirror, two.nic_mirror = mirrors
            got = chain_arrays.unrelayed_chain(fold, root, receivers)
            want = _two_sorts(two, root, receivers)
            assert got == want
            assert list(fold._may_relay.items()) == list(two._may_relay.items())
            asked += len(fold._may_relay)
            if want is None:
                none += 1
                continue
            assert fold.crossings == two.crossings
            base = chain_arrays._order(two, root, receivers)[0].tolist()
            moved += list(want) != base
            if mirrors[0] is not None:
                assert mirrors[0].chain is got and mirrors[1].chain is want
                assert mirrors[0].at.tolist() == mirrors[1].at.tolist()
    assert moved >= 20 and none >= 2 and asked >= 50 and bent >= 5

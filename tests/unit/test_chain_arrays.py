"""Long chains by arrays (planner/cells/chain_arrays.py): where no host boundary of a
long chain may relay, ``unrelayed_chain`` answers :meth:`Loads.relay_chain` with
sorts of arrays; its answer, and every load left behind, is the one the walk one
boundary at a time gives (the path with arrays turned off), on random load tables
whose values tie, with and without expectations that let some boundaries relay."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.cells import balance, chain_arrays
from tests.unit._twin_loads import twin_loads

CLUSTER = Cluster.preset("dgx-h100", 24)  # a NIC per device: relays possible


def _state(loads: balance.Loads) -> tuple[object, ...]:
    def table(t: dict) -> list:
        return sorted((k, v) for k, v in t.items() if v)
    return (table(loads.nic_out), table(loads.nic_in), table(loads.moved), loads.shared,
            loads._epoch)


def _twins(rng: random.Random, crowded: bool) -> tuple[balance.Loads, balance.Loads]:
    return twin_loads(rng, CLUSTER, crowded)


@pytest.mark.parametrize("seed", range(6))
def test_a_long_chain_s_answer_by_arrays_is_the_walk_s(seed, monkeypatch):
    rng = random.Random(seed)
    fast = fell_back = reordered = 0
    for trial in range(8):
        arrays, walk = _twins(rng, crowded=trial % 2 == 1)
        for _ in range(6):
            root = rng.randrange(24 * 8)
            receivers = frozenset(rng.sample(range(24 * 8), rng.choice([66, 100, 191]))) - {root}
            if rng.random() < 0.2:  # the root's host among the receivers, and one more
                receivers = frozenset(range(8)) - {root} | frozenset(range(8, 70))
            nbytes = rng.choice([500, 1 << 20])
            ask = chain_arrays.unrelayed_chain(arrays.copy(), root, sorted(receivers))
            fast += ask is not None
            fell_back += ask is None
            got = arrays.relay_chain(root, receivers, nbytes)
            monkeypatch.setattr(balance, "ARRAY_CHAIN", 1 << 30)
            want = walk._relay_through(root, tuple(receivers), nbytes)
            reordered += got[0] != walk.chain(root, receivers)
            monkeypatch.undo()
            assert got == want
            arrays.charge(root, got[0], nbytes)
            walk.charge(root, want[0], nbytes)
            assert _state(arrays) == _state(walk)
    assert fast >= 10 and fell_back >= 1 and reordered >= 10


@pytest.mark.parametrize("seed", range(3))
def test_a_slice_s_demand_remembered_is_the_demand_worked_out_afresh(seed, monkeypatch):
    """Slices of a few needer sets, few and many, (as a broadcast's cells share theirs), from holders
    on other hosts and on the needers' own: every answer of the accumulator's memo
    (:class:`balance.NeederMemo`) is the one a fresh memo gives, in the same order,
    and the amounts the loop one needer at a time gives."""
    rng = random.Random(seed)
    loads = balance.Loads(CLUSTER)
    needer_sets = [frozenset(rng.sample(range(128), size))
                   for size in (5, 12, rng.choice([70, 100, 128]))]  # on hosts 0-15
    for _ in range(60):
        needers = rng.choice(needer_sets)
        anywhere = rng.random() < 0.3  # else on hosts 16-23, which need nothing
        holders = frozenset(rng.sample(range(0 if anywhere else 128, 192),
                                       rng.choice([1, 1, 2, 9])))
        nbytes = rng.choice([3, 1 << 20, 12345677])
        got = loads.demand(holders, needers - holders, nbytes)
        assert got == balance.slice_demand(loads.host, loads.nic, False, holders,
                                           needers - holders, nbytes)
        monkeypatch.setattr(balance, "ARRAY_CHAIN", 1 << 30)
        by_loop = balance.Loads(CLUSTER).demand(holders, needers - holders, nbytes)
        monkeypatch.undo()
        assert dict(got[0]) == dict(by_loop[0]) and len(got[0]) == len(by_loop[0])
    assert len(loads._needers.entries) < 40  # answers were reused


@pytest.mark.parametrize("seed", range(4))
def test_a_short_chain_s_quick_walk_is_the_whole_walk(seed):
    """``Loads._relay_walk`` where no boundary may relay (``quick``) answers as the
    walk asking every boundary does, and leaves the same loads; on chains of a few
    hosts, with and without expectations that let some boundaries relay."""
    rng = random.Random(seed)
    quick = whole_relayed = moved = 0
    for trial in range(10):
        fast, whole = _twins(rng, crowded=trial % 2 == 1)
        for _ in range(10):
            root = rng.randrange(24 * 8)
            hosts = rng.sample(range(24), rng.choice([1, 2, 3, 5]))
            pool = [d for h in hosts for d in CLUSTER.hosts[h] if d != root]
            receivers = tuple(rng.sample(pool, rng.randint(1, min(len(pool), 20))))
            nbytes = rng.choice([500, 1 << 20])
            chain = fast.chain(root, receivers)
            got = fast._relay_walk(root, chain, nbytes)
            want = whole._relay_walk(root, chain, nbytes, quick=False)
            assert got == want
            assert _state(fast) == _state(whole)
            quick += not want[1]
            whole_relayed += bool(want[1])
            moved += got[0] != chain
            fast.charge(root, got[0], nbytes)
            whole.charge(root, want[0], nbytes)
    assert quick >= 20 and whole_relayed >= 1 and moved >= 10


@pytest.mark.parametrize("seed", range(3))
def test_a_short_chain_s_order_is_the_order_by_arrays(seed):
    """``Loads.chain`` one by one (its shortcut for receivers all on one other host
    included) orders a few receivers as :func:`chain_arrays.chain_arrays` does: on
    one other host, on the root's host alone, and on several."""
    rng = random.Random(seed)
    loads = _twins(rng, crowded=False)[0]
    for _ in range(200):
        root = rng.randrange(24 * 8)
        hosts = rng.sample(range(24), rng.choice([1, 1, 2, 3]))
        if rng.random() < 0.3:
            hosts[0] = CLUSTER.host_of(root)
        pool = [d for h in hosts for d in CLUSTER.hosts[h] if d != root]
        receivers = rng.sample(pool, rng.randint(1, len(pool)))
        got = loads.chain(root, receivers)
        assert len(receivers) < balance.ARRAY_CHAIN
        assert got == chain_arrays.chain_arrays(loads, root, sorted(receivers))


@pytest.mark.parametrize("seed", range(6))
def test_one_receiver_a_host_is_ordered_as_the_general_sort(seed):
    """``_order``'s shortcut for receivers one a host (``Receivers.single``) against its
    general sort (the flag turned off), on load tables whose values tie, the root's host
    among the receivers' or not."""
    rng = random.Random(seed)
    taken = 0
    for trial in range(12):
        loads, _ = _twins(rng, crowded=trial % 2 == 1)
        if trial >= 10:  # a fraction and a NaN among the loads
            for bump in (1.5, float("nan")):
                loads.nic_out[rng.randrange(24 * 8)] += bump
        hosts = sorted(rng.sample(range(24), rng.choice([2, 9, 24])))
        receivers = sorted(h * 8 + rng.randrange(8) for h in hosts)
        root = rng.choice([receivers[0] ^ 1, rng.randrange(24 * 8)])
        receivers = [r for r in receivers if r != root]
        rec = chain_arrays._receivers(loads, receivers)
        assert rec.single
        got = chain_arrays._order(loads, root, receivers)
        rec.single = False
        want = chain_arrays._order(loads, root, receivers)
        rec.single = True
        taken += 1
        assert got[3] is None and want[3] is None  # (nothing asked to move)
        for a, b in zip(got[:3], want[:3]):
            assert a.tolist() == b.tolist() or repr(a.tolist()) == repr(b.tolist())
    assert taken == 12

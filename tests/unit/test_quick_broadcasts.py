"""The broadcast planners' per-cell reads made cheaper (issue 62, round fifteen): a
short chain from a receiver set's hosts split once (``short_chain.split_hosts``) and
``may_relay_end``'s cached answers read inline; ``pick_root`` of a few holders by one
``min``; kept chains keyed by ranks found inline. Each against the code it replaces
(kept here as it was): the same answers, the same tables with their keys added in the
same order, the same relay answers cached, on loads that tie, with and without
expectations that let some boundaries relay, on unseen tables."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.cells import allgather_runs, balance, cell_tasks, kept_chains, short_chain
from reshard.planner.cells.chain_arrays import idlest_last
from reshard.planner.cells.decompose import Cell
from reshard.planner.values.resources import NIC_IN, NIC_OUT
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import assert_same_loads, twin_loads
from tests.unit.test_holder_arrays import _old_pick_root

CLUSTER = Cluster.preset("dgx-h100", 12)  # a NIC per device: relays possible


def _old_remote_chain(loads, root, group, split=None):
    """``short_chain.remote_chain`` as it was (round fourteen; no split)."""
    assert split is None
    host, nic, nic_in, nic_out = loads.host, loads.nic, loads.nic_in, loads.nic_out
    hs = list(map(host, group))
    if not hs or host(root) in hs:
        return None
    may = loads.may_relay_end
    if hs.count(hs[0]) == len(hs):
        _, entry = min([(nic_in[nic(d)], d) for d in group])
        chain = (entry, *[d for d in group if d != entry])
        return chain, None if may(NIC_OUT, root) or may(NIC_IN, entry) else chain
    by_host = {}
    for r, h in zip(group, hs):
        by_host.setdefault(h, []).append(r)
    hosts = [h for _, h in sorted((min([nic_out[nic(d)] for d in g]), h)
                                  for h, g in by_host.items())]
    last = len(hosts) - 1
    segments = [[root]]
    for k, h in enumerate(hosts):
        g = by_host[h]
        segments.append(short_chain.entered(g, nic_in, nic_out, nic, k < last)
                        if len(g) > 1 else g)
    chain = tuple([d for seg in segments[1:] for d in seg])
    for k in range(last + 1):
        if may(NIC_OUT, segments[k][-1]):
            return chain, None
    for k in range(1, last + 2):
        if may(NIC_IN, segments[k][0]):
            return chain, None
    return chain, idlest_last(segments, nic_out, nic)


def _tables(loads):
    """Every table the planners write, with its keys' order, and the relay answers."""
    return [list(getattr(loads, name).items()) for name in
            ("nic_out", "nic_in", "dev_out", "dev_in", "moved", "_may_relay")]


def _twins(rng, trial):
    fast, slow = twin_loads(rng, CLUSTER, crowded=trial % 2 == 1)
    if trial % 3 == 2:  # unseen NICs: the reads add their keys, in the reads' order
        for loads in (fast, slow):
            loads.nic_out.clear()
            loads.nic_in.clear()
    return fast, slow


def _receivers(rng, root):
    hosts = rng.sample(range(len(CLUSTER.hosts)), rng.choice([1, 2, 3, 5]))
    if rng.random() < 0.15:  # the root's host among them: declined
        hosts[0] = CLUSTER.host_of(root)
    per = rng.choice([1, 2, 3, 8])
    return sorted({d for h in hosts for d in rng.sample(CLUSTER.hosts[h], per)} - {root})


@pytest.mark.parametrize("seed", range(5))
def test_a_short_chain_from_its_split_is_the_old_one(seed):
    rng = random.Random(seed)
    seen = {"declined": 0, "quick": 0, "walk": 0}
    for trial in range(9):
        fast, slow = _twins(rng, trial)
        other = fast.copy()
        for _ in range(15):
            root = rng.randrange(len(CLUSTER.devices))
            group = _receivers(rng, root)
            if not group:
                continue
            split = short_chain.split_hosts(fast.host, fast.nic, group)
            got = short_chain.remote_chain(fast, root, [], split)
            assert short_chain.remote_chain(other, root, group) == got
            want = _old_remote_chain(slow, root, group)
            assert got == want
            assert _tables(fast) == _tables(slow) == _tables(other)
            seen["declined" if got is None else "walk" if got[1] is None else "quick"] += 1
            if got is not None:
                for loads in (fast, slow, other):
                    loads.charge(root, got[0], 1 << 20)
    assert min(seen.values()) >= 5, seen


@pytest.mark.parametrize("seed", range(3))
def test_relay_chain_of_a_receiver_set_split_once_is_the_old_path_s(seed, monkeypatch):
    """``relay_chain`` of frozensets (their split kept in the needer memo) against
    tuples through the old ``remote_chain``, asked again and again."""
    rng = random.Random(seed)
    for trial in range(6):
        fast, slow = _twins(rng, trial)
        asks = []
        while len(asks) < 6:
            root = rng.randrange(len(CLUSTER.devices))
            group = _receivers(rng, root)
            if len(group) >= 2:
                asks.append((root, group))
        for _ in range(40):
            root, group = rng.choice(asks)
            nbytes = rng.choice([500, 1 << 20])
            mine = fast.relay_chain(root, frozenset(group), nbytes)
            monkeypatch.setattr(balance, "remote_chain", _old_remote_chain)
            want = slow.relay_chain(root, tuple(group), nbytes)
            monkeypatch.undo()
            assert mine == want
            fast.charge(root, mine[0], nbytes)
            slow.charge(root, want[0], nbytes)
            assert _tables(fast) == _tables(slow)
        assert fast._needers.split  # the splits kept


@pytest.mark.parametrize("seed", range(4))
def test_a_root_among_a_few_holders_is_the_loop_s(seed):
    rng = random.Random(seed)
    fast, slow = _twins(rng, seed)
    devices = list(CLUSTER.devices)
    for _ in range(200):
        k = rng.choice([0, 1, 2, 3, 5, 12, 40, 63])
        holders = rng.sample(devices, k)
        holders = frozenset(holders) if rng.random() < 0.6 else \
            tuple(holders) if rng.random() < 0.5 else holders + holders[:1]
        needer_hosts = set(rng.sample(range(len(CLUSTER.hosts)), rng.choice([0, 1, 1, 2, 4])))
        nbytes = rng.choice([0, 1 << 20, 3 << 20])
        got = fast.pick_root(holders, needer_hosts, nbytes)
        assert got == _old_pick_root(slow, holders, needer_hosts, nbytes)
        assert _tables(fast) == _tables(slow)
        if got >= 0:  # the pick sends (a few levels of bytes: keys tie)
            for loads in (fast, slow):
                loads.charge(got, (devices[-1 - got],), nbytes)


def _run(rng, cluster, n):
    """One-holder cells from host 0 to a few receiver sets over two to five hosts (few
    and many NICs), in stretches, with cells of two holders between them."""
    hosts = cluster.hosts
    sets = []
    for width in (2, 5):
        chosen = rng.sample(range(1, len(hosts)), width)
        sets.append(frozenset(d for h in chosen for d in rng.sample(hosts[h], 4)))
    run = []
    for k in range(n):
        needers = sets[(k // 20) % len(sets)]
        holders = frozenset([rng.choice(hosts[0])]) if rng.random() < 0.9 else \
            frozenset(rng.sample(list(cluster.devices), 2))
        run.append((Cell(((0, rng.choice([1, 3])), (k, k + 1)), holders, needers), 0, 2, 0))
    return run


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("variant", ["preset", "two-nics"])
def test_kept_chains_by_inline_ranks_are_each_cell_planned_afresh(seed, variant, monkeypatch):
    """Receiver sets of 8 NICs (a scan of the distinct loads) and of 20 (a table):
    ``plan_broadcasts`` with kept chains against ``plan_broadcast`` cell by cell."""
    rng = random.Random(seed)
    cluster = regular_clusters(8, 8)[variant]
    a, b = twin_loads(rng, cluster, False)
    run = _run(rng, cluster, 200)
    want = [cell_tasks.plan_broadcast(c, t, i, a, s) for c, t, i, s in run]
    taken = []
    plan = kept_chains.KeptChains.plan

    def counted(self, *args):
        got = plan(self, *args)
        if got is not None:
            taken.append(self._facts(args[0].needers).few)
        return got

    monkeypatch.setattr(kept_chains.KeptChains, "plan", counted)
    assert cell_tasks.plan_broadcasts(run, b) == want
    assert_same_loads(a, b, expected_order=False)
    assert len(taken) >= 100
    if variant == "preset":  # both ways of ranking met
        assert set(taken) == {True, False}


@pytest.mark.parametrize("preset", ["dgx-h100", None])
def test_an_allgather_run_of_uneven_hosts_cuts_each_split_s_pieces(preset):
    """A bulk all-gather run (``allgather_runs.plan_run``) whose needer hosts hold 2, 3,
    4 and 3 needers (pieces cut once per split, the hosts of as many sharing them)
    against ``plan_allgather`` cell by cell."""
    cluster = Cluster.regular(5, 8, preset=preset) if preset else Cluster.regular(5, 8)
    hosts = cluster.hosts
    needers = frozenset([*hosts[1][:2], *hosts[2][:3], *hosts[3][:4], *hosts[4][2:5]])
    run = [(Cell(((12 * k, 12 * k + 12), (0, 6 + k % 3)), frozenset([hosts[0][k % 8]]),
                 needers), 0, 2, k % 2) for k in range(24)]
    a, b = balance.Loads(cluster), balance.Loads(cluster)
    want = [cell_tasks.plan_allgather(c, t, i, a, s) for c, t, i, s in run]
    assert allgather_runs.plan_run(run, balance.Loads(cluster), cell_tasks.split_dim)
    assert cell_tasks.plan_allgathers(run, b) == want
    assert _tables(a) == _tables(b)


@pytest.mark.parametrize("seed", range(3))
def test_a_kept_chain_is_not_taken_from_a_root_never_asked_that_may_relay(seed):
    """Chains kept from roots that may not relay; then cells from roots never asked
    whose NIC out may relay (expected crowded): each walked and relayed, as cell by
    cell, its answer cached alike."""
    rng = random.Random(seed)
    cluster = Cluster.preset("dgx-h100", 8)
    receivers = frozenset(d for h in (4, 5, 6) for d in cluster.hosts[h][:3])
    calm = [cluster.hosts[0][0], cluster.hosts[1][0]]
    crowded = [cluster.hosts[2][k] for k in rng.sample(range(8), 3)]
    roots = [calm[k % 2] for k in range(60)] + crowded + [calm[0]] * 4
    run = [(Cell(((k, k + 1), (0, 64)), frozenset([r]), receivers), 0, 2, 0)
           for k, r in enumerate(roots)]
    a, b = balance.Loads(cluster), balance.Loads(cluster)
    for loads in (a, b):
        for r in crowded:
            loads.expected[(NIC_OUT, loads.nic(r))] = 1e12
            loads.nic_out[loads.nic(r)] = 1e9
        loads.expected_changed()
    want = [cell_tasks.plan_broadcast(c, t, i, a, s) for c, t, i, s in run]
    assert cell_tasks.plan_broadcasts(run, b) == want
    assert_same_loads(a, b, expected_order=False)
    assert all(b._may_relay[(NIC_OUT, r)] for r in crowded)
    assert all(t[0].through for t in want[60:63])

"""Short chains to other hosts kept by the ranks of the loads that decide them
(planner/cells/kept_chains.py, issue 62 round ten): a run planned by plan_broadcasts,
which takes a kept chain for a cell whose receivers' NIC loads rank as a kept cell's
did, gives the same tasks and leaves the same loads (keys in the same order, the same
relay answers) as each cell planned by plan_broadcast afresh; runs of a few receiver
sets over several hosts that repeat (loads that tie, that rotate, that begin with
fractions), roots whose NIC may relay (crowded clusters), receivers on the root's
host, one-host sets, sends and cells of several holders between them; and whole 4x8
partial-sum requests, estimated with and without kept chains."""

from __future__ import annotations

import random

import pytest

from reshard.cluster import Cluster
from reshard.layout import DeviceMesh, Layout
from reshard.planner.cells import cell_tasks, kept_chains
from reshard.planner.cells.decompose import Cell
from reshard.planner.estimates import CostCache, estimate_many
from reshard.planner.values.resources import NIC_OUT
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import assert_same_loads, twin_loads

HOSTS, GPUS = 6, 8


def _sets(rng, cluster):
    """Receiver sets: a few over several hosts (one device on some of them), one host
    whole, one within a host."""
    hosts = cluster.hosts
    sets = []
    for _ in range(3):
        chosen = rng.sample(range(1, len(hosts)), rng.randint(2, 4))
        members = [d for h in chosen for d in rng.sample(hosts[h], rng.choice([1, 3, 8]))]
        sets.append(frozenset(members))
    sets.append(frozenset(hosts[1]))
    sets.append(frozenset(rng.sample(hosts[2], 3)))
    return sets


def _run(rng, cluster, n):
    """``n`` cells: most broadcasts from one holder on host 0 to one of the sets in
    stretches; some from a holder on a receiver's host, sends and cells of several
    holders between them."""
    devices = list(cluster.devices)
    hosts = cluster.hosts
    sets = _sets(rng, cluster)
    run = []
    for k in range(n):
        needers = sets[0] if k < n // 3 else sets[rng.randrange(len(sets))]
        holders = frozenset([rng.choice(hosts[0])])
        roll = rng.random()
        if roll < 0.05:  # a root on a receiver's host
            holders = frozenset([rng.choice(sorted(needers))])
        elif roll < 0.1:  # a send
            needers = frozenset(rng.sample(devices, 1))
        elif roll < 0.15:  # several holders
            holders = frozenset(rng.sample(devices, 2))
        box = ((0, rng.choice([1, 3, 64])), (k, k + 1))
        run.append((Cell(box, holders, needers), k % 3, rng.choice([2, 2, 1]), k % 2))
    return run


def _cell_by_cell(run, loads):
    return [cell_tasks.plan_broadcast(c, t, i, loads, s) for c, t, i, s in run]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics"])
@pytest.mark.parametrize("crowded", [False, True])
@pytest.mark.parametrize("start", ["levels", "empty", "fractions"])
def test_a_run_with_kept_chains_is_each_cell_planned_afresh(seed, variant, crowded, start,
                                                            monkeypatch):
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    a, b = twin_loads(rng, cluster, crowded)
    for loads in (a, b):
        if start == "empty":  # no NIC seen yet: the planner adds their keys
            loads.nic_out.clear()
            loads.nic_in.clear()
        elif start == "fractions":
            for n in list(loads.nic_out)[::3]:
                loads.nic_out[n] += 0.25
                loads.nic_in[n] += 1 / 3
    run = _run(rng, cluster, 160)
    taken = []
    plan = kept_chains.KeptChains.plan

    def counted(self, cell, tensor, itemsize, step):
        got = plan(self, cell, tensor, itemsize, step)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(kept_chains.KeptChains, "plan", counted)
    want = _cell_by_cell(run, a)
    got = cell_tasks.plan_broadcasts(run, b)
    assert got == want
    assert_same_loads(a, b, expected_order=False)
    # most of the stretch to the first set (crowded: where no boundary may relay)
    assert sum(taken) >= (0 if crowded else 80)


@pytest.mark.parametrize("crowded_root", [None, 5, 17])
def test_the_kept_chain_is_taken_where_the_ranks_repeat(crowded_root, monkeypatch):
    """A partial sum's pieces to every device of four other hosts: 32 chains kept a
    rotation, every later cell taking one (the planner's own order asked only for
    the kept ones); ``crowded_root``: a root whose NIC out may relay (its cells
    walked, relaying, between the kept ones)."""
    cluster = Cluster.preset("dgx-h100", 8)
    receivers = frozenset(range(32, 64))
    roots = [8 * (k % 4) + k // 4 % 8 for k in range(256)]
    if crowded_root is not None:  # at other places than its own turns
        roots[40::37] = [crowded_root] * len(roots[40::37])
    run = [(Cell(((k, k + 1), (0, 512)), frozenset([root]), receivers), 0, 2, 0)
           for k, root in enumerate(roots)]
    a, b = twin_loads(random.Random(1), cluster, False)
    for loads in (a, b):
        loads.nic_out.clear()
        loads.nic_in.clear()
        if crowded_root is not None:
            loads.expected[(NIC_OUT, loads.nic(crowded_root))] = 1e9
            loads.nic_out[loads.nic(crowded_root)] = 1e9
            loads.expected_changed()
    calls = []
    remote = kept_chains.remote_chain

    def counted(loads, root, group, split=None):
        calls.append(root)
        return remote(loads, root, group, split)

    want = _cell_by_cell(run, a)
    monkeypatch.setattr(kept_chains, "remote_chain", counted)
    assert cell_tasks.plan_broadcasts(run, b) == want
    assert_same_loads(a, b, expected_order=False)
    assert len(calls) <= 40 + 8 * (crowded_root is not None) and \
        len({t[0].receivers for t in want}) > 8
    relayed = [t[0] for t in want if t[0].through]
    assert bool(relayed) == (crowded_root is not None)


def _request(src, dst, shape):
    a = Layout(DeviceMesh((4, 8), range(32)), src)
    b = Layout(DeviceMesh((4, 8), range(32, 64)), dst)
    return (shape, "bfloat16", a, b, Cluster.preset("dgx-h100", 8))


@pytest.mark.parametrize("src,dst,shape", [
    ("RS0+P1", "RR", (4096, 1024)), ("RR+P01", "RR", (2048, 2048)),
    ("S0R+P1", "S1R", (2048, 2048)), ("RS1+P0", "RS1", (1024, 4096))])
def test_partial_sum_requests_estimate_the_same_without_kept_chains(src, dst, shape,
                                                                    monkeypatch):
    req = _request(src, dst, shape)
    taken = []
    plan = kept_chains.KeptChains.plan

    def counted(self, *args):
        got = plan(self, *args)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(kept_chains.KeptChains, "plan", counted)
    got = estimate_many([req], cache=CostCache())
    monkeypatch.setattr(kept_chains.KeptChains, "plan", lambda self, *args: None)
    assert estimate_many([req], cache=CostCache()) == got
    assert sum(taken) > 0

"""Kept chains for cells of several holders (KeptChains.plan_held, issue 62 round
seventeen): plan_broadcasts, which picks such a cell's root as plan_broadcast does and
then takes a kept chain from it where the receivers' NIC loads rank as a kept cell's
did, gives the same tasks and leaves the same loads as each cell planned by
plan_broadcast afresh; holders on one host and on several, holders among the
receivers' hosts (the walk decides), holders that need the cell (copies: not kept),
one-holder cells to the same receivers between them (chains kept by either), loads
that tie, start empty or with fractions, and crowded expectations (relays)."""

from __future__ import annotations

import random

import pytest

from reshard.planner.cells import cell_tasks, kept_chains
from reshard.planner.cells.decompose import Cell
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import assert_same_loads, twin_loads

HOSTS, GPUS = 6, 8


def _run(rng, cluster, n):
    """``n`` cells to one of three receiver sets over hosts 2-5, from two or three
    holders on hosts 0-1 mostly; some one-holder, some with a holder on a receiver's
    host, some whose holders need the cell."""
    hosts = cluster.hosts
    sets = []
    for _ in range(3):
        chosen = rng.sample(range(2, len(hosts)), rng.randint(2, 4))
        sets.append(frozenset(d for h in chosen for d in rng.sample(hosts[h], rng.choice([1, 2, 4]))))
    near = [*hosts[0], *hosts[1]]
    run = []
    for k in range(n):
        needers = sets[0] if k < n // 3 else rng.choice(sets)
        holders = frozenset(rng.sample(near, rng.choice([2, 2, 3, 1])))
        roll = rng.random()
        if roll < 0.25:  # a holder on a receiver's host
            holders = holders | {rng.choice(sorted(needers))}
        elif roll < 0.31:  # a holder that needs it too (a copy)
            needers = needers | {min(holders)}
        box = ((k, k + 1), (0, rng.choice([512, 1024])))
        run.append((Cell(box, holders, needers), rng.randrange(2), 2, rng.randrange(2)))
    return run


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics"])
@pytest.mark.parametrize("crowded", [False, True])
@pytest.mark.parametrize("start", ["levels", "empty", "fractions"])
def test_several_holders_take_kept_chains_as_each_cell_afresh(seed, variant, crowded, start,
                                                              monkeypatch):
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    a, b = twin_loads(rng, cluster, crowded)
    for loads in (a, b):
        if start == "empty":
            loads.nic_out.clear()
            loads.nic_in.clear()
            loads.dev_out.clear()
        elif start == "fractions":
            for n in list(loads.nic_out)[::3]:
                loads.nic_out[n] += 0.25
                loads.nic_in[n] += 1 / 3
    run = _run(rng, cluster, 200)
    taken = []
    held = kept_chains.KeptChains.plan_held

    def counted(self, *args):
        got = held(self, *args)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(kept_chains.KeptChains, "plan_held", counted)
    want = [cell_tasks.plan_broadcast(c, t, i, a, s) for c, t, i, s in run]
    got = cell_tasks.plan_broadcasts(run, b)
    assert got == want
    assert_same_loads(a, b, expected_order=False)
    assert len(taken) > 100 and sum(taken) >= (0 if crowded else 60)


@pytest.mark.parametrize("variant", ["preset", "two-nics"])
def test_a_tie_goes_to_the_holder_on_a_receiver_s_host(variant):
    """Holders tied on every load, one on a receiver's host: plan_broadcast's root is
    that one (its host needs the cell), whose chain the walk decides (not kept)."""
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    a, b = twin_loads(random.Random(0), cluster, False)
    hosts = cluster.hosts
    needers = frozenset([*hosts[2][:2], *hosts[3][:2]])
    for loads in (a, b):
        for n in list(loads.nic_out):
            loads.nic_out[n] = loads.nic_in[n] = 0.0
    # one cell to seed the receivers' chain, then the tied cell
    run = [(Cell(((0, 1), (0, 64)), frozenset([hosts[0][0], hosts[1][0]]), needers), 0, 2, 0),
           (Cell(((1, 2), (0, 64)), frozenset([hosts[0][1], hosts[2][3]]), needers), 0, 2, 0)]
    want = [cell_tasks.plan_broadcast(c, t, i, a, s) for c, t, i, s in run]
    assert want[1][0].root == hosts[2][3]
    assert cell_tasks.plan_broadcasts(run, b) == want
    assert_same_loads(a, b, expected_order=False)

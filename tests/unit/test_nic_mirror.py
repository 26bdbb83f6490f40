"""A run of broadcasts reading its receivers' NIC loads from a mirror kept in step
with its charges (chain_arrays.NicMirror, cell_tasks._mirrored), issue 62 round nine:
the same tasks and the same loads, keys in the same order, as each cell planned by
plan_broadcast reading the loads' tables afresh; long chains to a few receiver sets
that repeat (the mirror read again), mixed with cells of every other kind (one-host
chains, sends, several holders, short chains: each writes loads the mirror did not
see), on crowded clusters too (chains that relay); the receive loads of the chains to
one list added once per member at the end where that is exact (whole numbers below
2**53), else in order (loads that begin with fractions or near 2**53)."""

from __future__ import annotations

import random

import pytest

from reshard.planner.cells import balance, cell_tasks, chain_arrays
from reshard.planner.cells.decompose import Cell
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import assert_same_loads, twin_loads

HOSTS, GPUS = 12, 8


def _run(rng, cluster, n):
    """``n`` cells: most broadcasts from one holder to one of three long receiver sets
    (at least ``ARRAY_CHAIN``) in stretches of eight, a third of every other kind."""
    devices = list(cluster.devices)
    hosts = cluster.hosts
    sets = [frozenset(rng.sample(devices, rng.choice([64, 72, 80]))) for _ in range(3)]
    run = []
    for k in range(n):
        needers = sets[k // 8 % 3]  # stretches of one set
        holders = frozenset(rng.sample(devices, 1))
        if rng.random() < 0.8:  # a root outside: the same receivers
            holders = frozenset(rng.sample([d for d in devices if d not in needers], 1))
        roll = rng.random()
        if roll < 0.1:  # to one other host
            h = rng.randrange(len(hosts))
            needers = frozenset(rng.sample(hosts[h], rng.randint(2, len(hosts[h]))))
        elif roll < 0.2:  # a send
            needers = frozenset(rng.sample(devices, 1))
        elif roll < 0.27:  # a short chain
            needers = frozenset(rng.sample(devices, rng.choice([2, 5, 12])))
        elif roll < 0.34:  # several holders
            holders = frozenset(rng.sample(devices, rng.choice([2, 3])))
        box = ((0, rng.choice([1, 3, 64])), (k, k + 1))
        run.append((Cell(box, holders, needers), k % 3, rng.choice([1, 2]), k % 2))
    return run


def _cell_by_cell(run, loads):
    """Each cell by plan_broadcast, no mirror (every chain reads the tables)."""
    return [cell_tasks.plan_broadcast(c, t, i, loads, s) for c, t, i, s in run]


def _receive_loads(rng, twins, start):
    """Each device's receive load to begin with: none, or some fractions (its sums
    then added in order), or near 2**53 (whole, but sums not exact)."""
    if start is None:
        return
    for d in rng.sample(sorted(twins[0].cluster.devices), 40):
        value = rng.choice([0.5, 3.25, 1e-3]) if start == "fractions" else \
            float(2**53 - rng.choice([0, 2, 1 << 20]))
        for loads in twins:
            loads.dev_in[d] = value


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics"])
@pytest.mark.parametrize("crowded", [False, True])
@pytest.mark.parametrize("start", [None, "fractions", "huge"])
def test_a_run_reading_its_mirror_is_each_cell_read_afresh(seed, variant, crowded, start,
                                                           monkeypatch):
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    a, b = twin_loads(rng, cluster, crowded)
    _receive_loads(rng, (a, b), start)
    run = _run(rng, cluster, 90)
    reads = []
    order = chain_arrays._order

    def counted(loads, root, receivers, idlest=False):
        mirror = loads.nic_mirror
        reads.append(mirror is not None and mirror.rec is chain_arrays._receivers(
            loads, receivers))
        return order(loads, root, receivers, idlest)

    monkeypatch.setattr(chain_arrays, "_order", counted)
    want = _cell_by_cell(run, a)
    assert not any(reads)
    got = cell_tasks.plan_broadcasts(run, b)
    assert got == want
    assert_same_loads(a, b, expected_order=False)
    # the mirror was read, where each receiver has a NIC of its own
    assert (sum(reads) >= 10) == (variant != "two-nics")
    assert b.nic_mirror is None


def test_a_copy_of_loads_holds_no_mirror():
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    loads = balance.Loads(cluster)
    loads.nic_mirror = chain_arrays.NicMirror()
    assert loads.copy().nic_mirror is None


def test_receive_loads_left_to_the_mirror_come_before_any_charge_after_them():
    """Charges of the noted chain are left to the mirror (the loads unchanged until a
    flush); a charge of any other chain adds them first, then its own: at every
    point the loads of charges made one by one on a twin with no mirror."""
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    loads, twin = balance.Loads(cluster), balance.Loads(cluster)
    receivers = list(range(8, 88))
    mirror = loads.nic_mirror = chain_arrays.NicMirror()
    left = 0
    for k, (root, nbytes) in enumerate([(0, 1000), (1, 3000), (2, 5), (3, 7), (4, 11)]):
        chain = chain_arrays.unrelayed_chain(loads, root, receivers)
        assert chain is not None and mirror.chain is chain
        if k == 3:
            chain = (*chain[:1], *chain[1:])  # the same members, not the chain noted
        before = dict(loads.dev_in)
        loads.charge(root, chain, nbytes)
        twin.charge(root, chain, nbytes)
        if k != 0 and k != 3:  # left to the mirror
            left += 1
            assert dict(loads.dev_in) == before
        else:
            assert list(loads.dev_in.items()) == list(twin.dev_in.items())
    mirror.flush(loads.dev_in)
    assert left == 3 and list(loads.dev_in.items()) == list(twin.dev_in.items())

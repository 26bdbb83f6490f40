"""``Loads.relay_chain`` remembers the chains it worked out (planner/cells/balance.py):
every answer, and every load it leaves behind, is the one working it out afresh gives,
on random load tables whose values repeat (so remembered answers are asked for again)
and whose order changes (so a key missing anything it reads answers wrongly). And
``treeify`` finds each chain's trees once (planner/cells/trees.py)."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.layout import box_size
from reshard.planner.cells import trees
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.trees import INTRA, SHAPES, treeify
from reshard.planner.values.tasks import Task, TaskKind

CLUSTERS = {
    "dgx-h100x4": Cluster.preset("dgx-h100", 4),  # a NIC per device: relays
    "p4d-x3": Cluster.preset("aws-p4d.24xlarge", 3),  # two devices per NIC
    "one-nic": Cluster.regular(4, 4),  # one NIC per host: chains only
    # _shared_binds reads the shared total, which moves only with expectations and
    # relays (a new epoch)
    "shared": Cluster.regular(3, 4, nic_bandwidth=1e9, nics_per_host=4,
                              shared_bandwidth=5e9),
}


def _state(loads: Loads) -> tuple[object, ...]:
    def table(t: dict) -> list:
        return sorted((k, v) for k, v in t.items() if v)
    return (table(loads.nic_out), table(loads.nic_in), table(loads.moved), loads.shared,
            loads._epoch)


def _twins(cluster: Cluster, rng: random.Random) -> tuple[Loads, Loads]:
    """Two accumulators with the same random expectations (relays have work to do)."""
    devices = list(cluster.devices)
    twins = Loads(cluster), Loads(cluster)
    for _ in range(20):
        holders = frozenset(rng.sample(devices, rng.randint(1, 3)))
        needers = frozenset(rng.sample(devices, rng.randint(2, len(devices))))
        nbytes = rng.choice([1000, 5000, 40000])
        for loads in twins:
            loads.expect(holders, needers - holders, nbytes)
    return twins


@pytest.mark.parametrize("seed", [7011, 12011])
@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_remembered_chains_equal_chains_worked_out_afresh(name, seed):
    cluster = CLUSTERS[name]
    rng = random.Random(seed)
    devices = list(cluster.devices)
    memo, fresh = _twins(cluster, rng)
    asks = [(rng.choice(devices), frozenset(rng.sample(devices, rng.randint(2, 9))))
            for _ in range(3)]
    nics = sorted({memo.nic(d) for d in devices})
    # load tables, their values from a few levels (they tie), each asked again shifted
    tables = [{n: float(rng.choice([0, 1, 1, 2, 3]) * 1000) for n in nics}
              for _ in range(2)]
    worked = []
    memo._relay_through = lambda *a: worked.append(a) or Loads._relay_through(memo, *a)
    calls = relayed = 0
    for step in range(400):
        if rng.random() < 0.5:
            for table in ("nic_out", "nic_in"):  # each its own table, shifted or not
                shift = rng.choice([0.0, 250.0, 1e6])
                for n, v in rng.choice(tables).items():
                    getattr(memo, table)[n] = getattr(fresh, table)[n] = v + shift
        root, receivers = rng.choice(asks)
        receivers = receivers - {root}
        nbytes = rng.choice([500, 100_000])  # the larger relays less
        if rng.random() < 0.2:  # the root's keep_off: half its host's devices or none
            mates = cluster.hosts[cluster.host_of(root)]
            others = frozenset(rng.sample(mates, len(mates) // 2))
            keep = rng.random() < 0.5
            for loads in (memo, fresh):
                if keep:
                    loads.keep_off[root] = others
                else:
                    loads.keep_off.pop(root, None)
        got = memo.relay_chain(root, receivers, nbytes)
        calls += 1
        relayed += bool(got[1])
        assert got == fresh._relay_through(root, tuple(receivers), nbytes), (name, step)
        if rng.random() < 0.5:
            memo.charge(root, got[0], nbytes)
            fresh.charge(root, got[0], nbytes)
        assert _state(memo) == _state(fresh)
    kept = sum(len(answers) for _, answers in memo._chains.chains.values())
    assert kept > 0 and calls - len(worked) >= 20  # answers from the memo
    if cluster.nics_per_host > 1 and not cluster.shared_bandwidth:
        assert relayed > 0  # relays moved bytes (their answers are not kept)


def test_a_copy_remembers_nothing_of_the_original():
    cluster = CLUSTERS["dgx-h100x4"]
    loads = Loads(cluster)
    loads.relay_chain(0, frozenset(range(1, 20)), 100)
    assert loads._chains.chains and not loads.copy()._chains.chains


def test_demand_is_what_expect_adds():
    """``Loads.demand`` reads nothing of the accumulator; ``expect`` adds it whole."""
    cluster = CLUSTERS["shared"]
    rng = random.Random(3)
    devices = list(cluster.devices)
    loads = Loads(cluster)
    for _ in range(50):
        holders = frozenset(rng.sample(devices, rng.randint(1, 3)))
        needers = frozenset(rng.sample(devices, rng.randint(1, len(devices)))) - holders
        amounts, shared = loads.demand(holders, needers, 777)
        before = dict(loads.expected), loads.shared
        loads.expect(holders, needers, 777)
        assert loads.shared == before[1] + shared
        assert len({k for k, _ in amounts}) == len(amounts)
        for k, v in amounts:
            assert loads.expected[k] == before[0].get(k, 0.0) + v
        assert loads.demand(holders, needers, 777) == (amounts, shared)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("intra", INTRA)
def test_trees_found_once_per_chain_equal_each_task_reshaped_alone(shape, intra):
    """``treeify`` finds each chain's trees once per call (its pieces repeat it): the
    same tasks as reshaping each task on its own."""
    cluster = CLUSTERS["dgx-h100x4"]
    host = cluster.host_of
    rng = random.Random(5)
    devices = list(cluster.devices)
    chains = []
    root = devices[0]
    for _ in range(3):  # one root; each chain with and without relay-only devices
        receivers = rng.sample(devices[1:], rng.randint(6, 20))
        for through in ((), tuple(rng.sample(receivers, 2))):
            chains.append((root, tuple(receivers), through))
    tasks = []
    for k in range(40):
        root, receivers, through = rng.choice(chains)
        box = ((k * 64, k * 64 + rng.choice([1, 2, 64])), (0, 32))
        tasks.append(Task(TaskKind.BROADCAST, 0, box, root, receivers,
                          box_size(box) * 2, k % 3, through=through))
    alone = [u for t in tasks for u in (trees._reshape(t, host, intra, shape)
                                        if trees._applies(t, host, shape) else [t])]
    assert alone != tasks  # some chains reshaped
    assert treeify(tasks, host, intra, shape) == tuple(alone)

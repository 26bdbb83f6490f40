"""A long chain's NIC charges made on a mirror's copies and written back to the tables
(chain_arrays.NicMirror.charge, from charge_crossings), issue 62 round eleven: the
same tables, keys in the same order, as the loop one crossing at a time (no mirror),
and copies still equal to the tables; chains of many receivers whose root's host is
among theirs or not, tables that hold every NIC or none yet (keys added in the
loop's order), and a root whose NIC is a receiver's (charged through its copy)."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.cells import balance, chain_arrays
from tests.unit._twin_loads import twin_loads

CLUSTER = Cluster.preset("dgx-h100", 16)


def _receivers(rng, root, away):
    """Many receivers; ``away``: none on the root's host."""
    hosts = rng.sample([h for h in range(16) if not away or h != root // 8],
                       rng.choice([9, 12, 15]))
    out = [d for h in hosts for d in rng.sample(CLUSTER.hosts[h], rng.choice([5, 8, 8]))]
    return sorted(set(out) - {root})


def _sharing(root, other):
    """The cluster's NICs but the root's: ``other``'s."""
    return lambda d: CLUSTER.nic_of(other if d == root else d)


@pytest.mark.parametrize("seed", range(6))
def test_charges_on_the_copies_are_the_loop_s(seed):
    rng = random.Random(seed)
    fast = from_root = shared = 0
    for trial in range(10):
        if trial % 3 == 0:  # nothing charged yet: every key added by these charges
            a, b = balance.Loads(CLUSTER), balance.Loads(CLUSTER)
        else:
            a, b = twin_loads(rng, CLUSTER, crowded=False)
        root = rng.randrange(16 * 8)
        receivers = _receivers(rng, root, trial % 4 != 3)
        mirror = a.nic_mirror = chain_arrays.NicMirror()
        nic = CLUSTER.nic_of
        if trial % 2:  # the root's NIC a receiver's (a cluster of shared NICs would)
            other = rng.choice([d for d in receivers if a.host(d) != a.host(root)])
            nic = _sharing(root, other)
        for _ in range(4):
            chain = chain_arrays.unrelayed_chain(a, root, receivers)
            assert chain is not None and mirror.rec is not None
            nbytes = rng.choice([1, 1 << 20, 12345])
            known = a.crossings
            fast += bool(known[2])
            from_root += bool(known[2]) and known[2][0] == 0
            shared += trial % 2 and known[2][0] == 0
            chain_arrays.charge_crossings(a.host, nic, a.nic_out, a.nic_in, root, chain,
                                          nbytes, known, mirror)
            chain_arrays.charge_crossings(b.host, nic, b.nic_out, b.nic_in, root, chain,
                                          nbytes, None, None)
            assert list(a.nic_out.items()) == list(b.nic_out.items())
            assert list(a.nic_in.items()) == list(b.nic_in.items())
            assert mirror.charges and mirror.rec is not None
            nics = mirror.rec.nics
            assert mirror.sent.tolist() == [b.nic_out.get(n, 0.0) for n in nics]
            assert mirror.got.tolist() == [b.nic_in.get(n, 0.0) for n in nics]
    assert fast >= 30 and from_root >= 10 and shared >= 5

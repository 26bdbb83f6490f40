"""Receivers known distinct by their type (balance._distinct), issue 62 round eleven:
a set's members are each once, so a long chain to them goes by arrays without the
check; a list or tuple that names a device twice still goes the loop's way. The same
chains as the loop one receiver at a time (the arrays' path turned off)."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.cells import balance, chain_arrays
from tests.unit._twin_loads import twin_loads

CLUSTER = Cluster.preset("dgx-h100", 16)


@pytest.mark.parametrize("seed", range(4))
def test_a_set_goes_by_arrays_and_a_list_with_repeats_by_the_loop(seed, monkeypatch):
    rng = random.Random(seed)
    by_arrays = []
    real = chain_arrays.chain_arrays

    def counted(loads, root, receivers):
        by_arrays.append(len(receivers))
        return real(loads, root, receivers)

    monkeypatch.setattr(balance, "chain_arrays", counted)
    for _ in range(6):
        loads, _ = twin_loads(rng, CLUSTER, crowded=False)
        root = rng.randrange(128)
        members = rng.sample([d for d in range(128) if d != root], rng.choice([64, 90]))
        repeated = [*members, *rng.sample(members, 3)]
        got = {kind: loads.chain(root, kind(members)) for kind in (frozenset, set, tuple)}
        twice = loads.chain(root, repeated)
        assert by_arrays == [len(members)] * 3
        by_arrays.clear()
        monkeypatch.setattr(balance, "ARRAY_CHAIN", 1 << 30)
        want = loads.chain(root, members)
        want_twice = loads.chain(root, repeated)
        monkeypatch.setattr(balance, "ARRAY_CHAIN", 64)
        assert all(chain == want for chain in got.values())
        assert twice == want_twice
        by_arrays.clear()

"""``chain_arrays.may_relay_any`` (a direction's relay questions of many members read
from an array mirror of :meth:`Loads.may_relay_end`'s cache) against the questions
asked one by one as ``any()`` asked them: the same answer and the same cache left
behind (entries, values and their order), on crowded random expectations, with the
cache partly filled beforehand, grown between calls and copied (``Loads.copy``: the
copy and its original both asked on)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard import Cluster
from reshard.planner.cells import chain_arrays
from reshard.planner.values.resources import NIC_IN, NIC_OUT
from tests.unit._twin_loads import twin_loads

CLUSTER = Cluster.preset("dgx-h100", 12)  # a NIC per device: relays possible


def _one_by_one(loads, direction, members):
    return any(loads.may_relay_end(direction, m) for m in members.tolist())


@pytest.mark.parametrize("seed", range(6))
def test_relay_questions_by_array_are_the_questions_one_by_one(seed):
    rng = random.Random(seed)
    pairs = [twin_loads(rng, CLUSTER, crowded=True)]
    devices = list(CLUSTER.devices)
    answers = {True: 0, False: 0}
    known_yes = 0
    for step in range(120):
        fast, slow = rng.choice(pairs)
        if rng.random() < 0.3:  # ask a few beforehand, on both
            for m in rng.sample(devices, rng.randint(1, 6)):
                way = rng.choice([NIC_OUT, NIC_IN])
                assert fast.may_relay_end(way, m) == slow.may_relay_end(way, m)
        if step % 40 == 39:  # a copy has its own cache; both go on being asked
            pairs.append((pairs[-1][0].copy(), pairs[-1][1].copy()))
        fast, slow = rng.choice(pairs)
        way = rng.choice([NIC_OUT, NIC_IN])
        members = np.array(rng.sample(devices, rng.randint(1, 10)), dtype=np.int64)
        before = len(fast._may_relay)
        got = chain_arrays.may_relay_any(fast, way, members)
        known_yes += got and len(fast._may_relay) == before
        assert got == _one_by_one(slow, way, members)
        assert list(fast._may_relay.items()) == list(slow._may_relay.items())
        answers[got] += 1
    assert answers[True] >= 10 and answers[False] >= 10 and known_yes >= 5

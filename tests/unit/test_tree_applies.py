"""Which chains a host shape reshapes, and a chain's hosts numbered in the order
entered by one dict of them (trees.py, issue 62 round nine): the answers of the loops
(the dict comprehension it replaces), on random segment lists and host orders."""

from __future__ import annotations

import random

import pytest

from reshard.planner.cells import chain_cuts, trees
from reshard.planner.cells.trees import MIN_FANOUT, HostShape
from reshard.planner.values.tasks import Task, TaskKind


@pytest.mark.parametrize("seed", range(4))
def test_a_chain_shape_applies_where_some_host_past_the_root_s_has_enough(seed):
    rng = random.Random(seed)
    seen = set()
    for _ in range(300):
        segs = [[0] * rng.randint(1, 5) for _ in range(rng.randint(1, 6))]
        want = any(len(seg) >= MIN_FANOUT for seg in segs[1:])
        assert trees._APPLIES[HostShape.CHAIN](segs) is want
        seen.add(want)
    assert seen == {True, False}


def _old_number(entered):
    return {h: i for i, h in enumerate(dict.fromkeys(entered))}


@pytest.mark.parametrize("seed", range(3))
def test_a_chain_s_hosts_numbered_in_the_order_entered(seed):
    rng = random.Random(seed)
    for _ in range(50):
        hosts = rng.sample(range(40), rng.randint(2, 12))
        chain, host_of = [], {}
        d = 0
        if rng.random() < 0.5:  # a host entered again (numbered by its first entry)
            hosts.append(rng.choice(hosts[:-1]))
        for h in hosts:  # each host's devices together
            for _ in range(rng.randint(1, 3)):
                host_of[d] = h
                chain.append(d)
                d += 1
        task = Task(TaskKind.BROADCAST, 0, ((0, 8),), chain[0], tuple(chain[1:]), 16)
        _, _, (lengths, numbered, relays) = chain_cuts.chain_of(task, host_of.__getitem__)
        entered = [host_of[seg[0]] for seg in chain_cuts.segments(task, host_of.__getitem__)]
        assert numbered == tuple(map(_old_number(entered).__getitem__, entered))
        assert sum(lengths) == len(chain) and relays == ()

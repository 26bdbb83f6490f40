"""``stepgate.distinct_devices`` on few memberships (fewer than ``ARRAY_MEMBERS``):
where no task lists a device twice (found by one sort of the (task, device) keys) the
devices as they are, else each task's distinct devices in its order by dicts, as before
(the oracle here): the same arrays, with repeats or without, tasks of no device too."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from reshard.planner.costing import stepgate


def _old(devs):  # type: ignore[no-untyped-def]
    firsts = [dict.fromkeys(d) for d in devs]
    need = np.array([len(f) for f in firsts], dtype=np.int64)
    return need, np.array(list(itertools.chain.from_iterable(firsts)), dtype=np.int64)


def _devs(seed: int, repeats: bool) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    out = []
    for _ in range(rng.choice([0, 1, 3, 50, 400])):
        k = rng.choice([0, 1, 2, 2, 3, 6])
        got = tuple(rng.sample(range(40), k))
        if repeats and got and rng.random() < 0.1:
            got = (*got, rng.choice(got))  # a device listed twice (a root as receiver)
        out.append(got)
    return out


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("repeats", [False, True])
def test_few_memberships_are_the_old_ones(seed, repeats):
    devs = _devs(seed, repeats)
    assert sum(map(len, devs)) < stepgate.ARRAY_MEMBERS
    need, member = stepgate.distinct_devices(devs)
    want_need, want = _old(devs)
    assert need.tolist() == want_need.tolist() and member.tolist() == want.tolist()
    assert need.dtype == np.int64 and member.dtype == np.int64


@pytest.mark.parametrize("devs,want", [
    ([(3, 3)], True), ([(3,), (3,)], False), ([(0, 5), (5, 0)], False),
    ([(1, 2, 1)], True), ([(), (4, 4)], True), ([(7,)], False), ([], False)])
def test_repeats_are_a_device_twice_in_one_task(devs, want):
    lens = np.array([len(d) for d in devs], dtype=np.int64)
    flat = np.array([x for d in devs for x in d], dtype=np.int64)
    assert stepgate._repeats(flat, lens) is want

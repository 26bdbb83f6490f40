"""The lower bound's plain cells counted needer set by needer set (issue 62, round
six): :meth:`bound._Intake._receive` (the needers' hosts found once per set, the sums
by ``dict.update``) leaves every count the per-needer loop
(:meth:`bound._Intake._receive_each`) leaves, key by key in the same order, and the
same bound, bit for bit."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.costing import bound


def _counts(intake: bound._Intake) -> tuple[object, ...]:
    return (list(intake.dev_in.items()), list(intake.host_take.items()),
            list(intake.host_in.items()), list(intake.host_least.items()),
            list(intake.dev_copy.items()), sorted(intake.near), intake.bound())


def _each(self: bound._Intake, needs: bound._Needs, nbytes: float,
          hold_hosts: frozenset[int]) -> None:
    """The old way: every needer one by one."""
    holders = frozenset()  # the fast path runs only where no needer holds the cell
    self._receive_each(holders, frozenset(needs.order), nbytes, False, hold_hosts)


@pytest.mark.parametrize("seed", range(6))
def test_needer_sets_count_as_the_loop_does(seed, monkeypatch):
    rng = random.Random(seed)
    cluster = Cluster.preset("dgx-h100", 12)
    devices = sorted(cluster.host_map)
    sets = [frozenset(rng.sample(devices, rng.randint(1, 60))) for _ in range(5)]
    cells = []
    for _ in range(200):
        needers = rng.choice(sets)
        holders = frozenset(rng.sample(devices, rng.randint(1, 3)))
        cells.append((holders, needers, rng.choice([3, 1 << 20, 12345.5, 7e6])))
    fast, slow = bound._Intake(cluster), bound._Intake(cluster)
    for holders, needers, nbytes in cells:
        fast._cell(holders, needers, nbytes, 0, set())
    monkeypatch.setattr(bound._Intake, "_receive", _each)
    for holders, needers, nbytes in cells:
        slow._cell(holders, needers, nbytes, 0, set())
    assert _counts(fast) == _counts(slow)

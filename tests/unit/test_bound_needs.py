"""The lower bound's plain cells counted needer set by needer set (issue 62, round
six): :meth:`bound._Intake._receive` (the needers' hosts found once per set, the sums
by ``dict.update``) leaves every count the per-needer loop
(:meth:`bound._Intake._receive_each`) leaves, key by key in the same order, and the
same bound, bit for bit; since round eight (62z1) a run of cells of one needer set is
summed once per key's (start, additions) by :meth:`bound._Intake.settle`, between cells
that read or write the same counts another way."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.costing import bound


def _counts(intake: bound._Intake) -> tuple[object, ...]:
    intake.settle()
    return (list(intake.dev_in.items()), list(intake.host_take.items()),
            list(intake.host_in.items()), list(intake.host_least.items()),
            list(intake.dev_copy.items()), sorted(intake.near), intake.bound())


def _each(self: bound._Intake, needs: bound._Needs, nbytes: float,
          hold_hosts: frozenset[int]) -> None:
    """The old way: every needer one by one, in the needer set's own order (what
    :meth:`bound._Intake._receive_each` does for a plain cell no needer holds)."""
    for d in needs.order:
        h = self.host_of(d)
        self.dev_in[d] = self.dev_in.get(d, 0.0) + nbytes
        self.host_take[h] = self.host_take.get(h, 0.0) + nbytes
        if h in hold_hosts:
            self.near.add(d)


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


@pytest.mark.parametrize("seed", range(6))
def test_runs_of_one_needer_set_sum_as_the_loop_does(seed, monkeypatch):
    """Long runs of one needer set among one-to-one cells and cells a needer holds,
    with bytes whose sums depend on their order (0.1, 1e17 / 3): every count, its key
    order and the bound as the per-needer loop leaves them."""
    rng = random.Random(seed)
    cluster = Cluster.preset("dgx-h100", 12)
    devices = sorted(cluster.host_map)
    sets = [frozenset(rng.sample(devices, rng.randint(1, 60))) for _ in range(3)]
    sizes = [0.1, 1e17 / 3, 3, 12345.5, 7e6 / 7, 2.0 ** 60 + 1]
    cells = []
    for _ in range(40):
        needers, kind = rng.choice(sets), rng.random()
        for _ in range(rng.randint(1, 30)):
            if kind < 0.2:  # one holder, one needer
                cells.append((frozenset(rng.sample(devices, 1)),
                              frozenset(rng.sample(devices, 1)), rng.choice(sizes)))
            elif kind < 0.35:  # a needer holds it: counted needer by needer
                cells.append((frozenset(rng.sample(sorted(needers), 1)), needers,
                              rng.choice(sizes)))
            else:
                holders = frozenset(rng.sample(devices, rng.randint(1, 3))) - needers
                cells.append((holders or frozenset((min(set(devices) - needers),)),
                              needers, rng.choice(sizes)))

    def count(intake: bound._Intake) -> None:
        for holders, needers, nbytes in cells:
            if len(holders) == 1 and len(needers) == 1:
                intake._pair(next(iter(holders)), next(iter(needers)), nbytes)
            else:
                intake._cell(holders, needers, nbytes, 0, set())

    fast, slow = bound._Intake(cluster), bound._Intake(cluster)
    count(fast)
    monkeypatch.setattr(bound._Intake, "_receive", _each)
    count(slow)
    assert _counts(fast) == _counts(slow)

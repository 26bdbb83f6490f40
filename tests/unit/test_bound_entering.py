"""The lower bound's hosts' leasts taken once per needer set (and, for a sum, addends
and holder hosts; bound._Intake._host_in, issue 62 round nine): every count, its key
order, and the bound as the loop over ``need_hosts - summing`` that takes each host's
least again for every cell leaves them."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.costing import bound


def _old_host_in(self, needers, needs, hold_hosts, summing, size, nbytes):
    """The loop as it was, every cell."""
    summed = size > 0
    for h in needs.host_set - summing:
        self.host_in[h] = self.host_in.get(h, 0.0) + nbytes
        adds = size if summed and h not in hold_hosts else 1
        spread = needs.per_host[h]
        least = self.host_least.get(h, (adds, spread))
        self.host_least[h] = (min(least[0], adds), min(least[1], spread))


def _counts(intake: bound._Intake) -> tuple[object, ...]:
    intake.settle()
    return (list(intake.dev_in.items()), list(intake.host_take.items()),
            list(intake.host_in.items()), list(intake.host_least.items()),
            list(intake.dev_copy.items()), sorted(intake.near), intake.merged,
            [(k, list(v)) for k, v in intake.leave.items()], intake.bound())


@pytest.mark.parametrize("seed", range(6))
def test_hosts_entered_found_once_count_as_the_loop_every_cell(seed, monkeypatch):
    rng = random.Random(seed)
    cluster = Cluster.preset("dgx-h100", 12)
    devices = sorted(cluster.host_map)
    sets = [frozenset(rng.sample(devices, rng.randint(2, 60))) for _ in range(4)]
    sets += [frozenset({8, 16}), frozenset({8, 9, 16})]  # one set of hosts, spread apart
    holder_sets = [frozenset(rng.sample(devices, rng.randint(1, 12))) for _ in range(4)]
    sizes = [0.1, 1e17 / 3, 3, 12345.5, 2.0 ** 60 + 1]
    cells = []
    for _ in range(300):
        kind = rng.random()
        needers, holders = rng.choice(sets), rng.choice(holder_sets)
        if kind < 0.1:  # one holder, one needer: the least there is
            cells.append((frozenset(rng.sample(devices, 1)), frozenset(rng.sample(devices, 1)),
                          rng.choice(sizes), 0, set()))
        elif kind < 0.4:  # a summed source's cell: its addends, their hosts inside
            size = rng.choice([2, 4, 8])
            inside = {d // 8 if rng.random() < 0.7 else None for d in holders}
            cells.append((holders, needers, rng.choice(sizes), size, inside))
        else:
            cells.append((holders, needers, rng.choice(sizes), 0, set()))

    def count(intake: bound._Intake) -> None:
        for holders, needers, nbytes, size, inside in cells:
            if not size and len(holders) == 1 and len(needers) == 1:
                intake._pair(next(iter(holders)), next(iter(needers)), nbytes)
            else:
                intake._cell(holders, needers, nbytes, size, inside)

    fast, slow = bound._Intake(cluster), bound._Intake(cluster)
    count(fast)
    assert len(fast.least_taken) < len(cells) / 2  # the leasts taken once, skipped again
    monkeypatch.setattr(bound._Intake, "_host_in", _old_host_in)
    count(slow)
    assert _counts(fast) == _counts(slow)


@pytest.mark.parametrize("order", [0, 1])
def test_a_host_s_least_lowered_by_a_later_cell_of_other_needers_or_addends(order, monkeypatch):
    """Cells whose hosts entered are the same set but whose least differs (needers
    spread two and one a host; a sum of eight addends then of two), the larger first:
    each later cell lowers the least, as the loop does; a needer set held on one of
    its hosts, then sent there."""
    cluster = Cluster.preset("dgx-h100", 8)
    holders = frozenset({0, 1})
    cells = [(holders, frozenset({8, 9, 16}), 5.0, 0, set()),
             (holders, frozenset({8, 16}), 5.0, 0, set()),
             (holders, frozenset({24, 25}), 7.0, 8, {0}),
             (holders, frozenset({24, 25}), 7.0, 2, {0})]
    cells = cells if order == 0 else cells[2:] + cells[:2]
    # a needer set entering a host it held before (its least not taken yet)
    cells += [(frozenset({41}), frozenset({40, 48}), 3.0, 0, set()),
              (frozenset({1}), frozenset({40, 48}), 3.0, 0, set())]
    got = []
    for way in (bound._Intake._host_in, _old_host_in):
        monkeypatch.setattr(bound._Intake, "_host_in", way)
        intake = bound._Intake(cluster)
        for c in cells:
            intake._cell(*c)
        got.append(_counts(intake))
    assert got[0] == got[1]
    assert dict(got[1][3]) == {1: (1, 1), 2: (1, 1), 3: (2, 2), 5: (1, 1), 6: (1, 1)}

"""reduce._one_holder_broadcasts (planner/cells/reduce.py, issue 62 round eighteen: the
sets a table's rows use found by a count per set, not ``np.unique``) against the
``np.unique`` form it replaces, over tables whose rows use some of their sets, of one
holder or several, of one needer or several."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.cells import reduce


class _Table:
    """What _one_holder_broadcasts reads of a CellTable."""

    def __init__(self, holder, needer, holder_sets, needer_sets):
        self.holder, self.needer = holder, needer
        self.holder_sets, self.needer_sets = holder_sets, needer_sets

    def __len__(self):
        return len(self.holder)


def _by_unique(table):
    hold, need = table.holder_sets, table.needer_sets
    return bool(len(table)) and \
        all(len(hold[h]) == 1 for h in np.unique(table.holder).tolist()) and \
        all(len(need[n]) >= 2 for n in np.unique(table.needer).tolist())


@pytest.mark.parametrize("seed", range(40))
def test_one_holder_broadcasts_is_the_unique_form(seed):
    rng = random.Random(seed)
    sets = [frozenset(rng.sample(range(16), rng.choice([1, 1, 2, 3]))) for _ in range(9)]
    holder_sets, needer_sets = tuple(rng.sample(sets, 5)), tuple(rng.sample(sets, 6))
    # rows that use only some sets (an unused one of several holders decides nothing)
    hold_used = rng.sample(range(5), rng.randint(1, 5))
    need_used = rng.sample(range(6), rng.randint(1, 6))
    n = rng.choice([0, 1, 7, 300])
    holder = np.array([rng.choice(hold_used) for _ in range(n)], dtype=np.int64)
    needer = np.array([rng.choice(need_used) for _ in range(n)], dtype=np.int64)
    table = _Table(holder, needer, holder_sets, needer_sets)
    assert reduce._one_holder_broadcasts(table) is _by_unique(table)


def test_the_cases_both_ways():
    one, two = frozenset({1}), frozenset({2, 3})
    rows = np.array([0, 0, 2], dtype=np.int64)
    assert reduce._one_holder_broadcasts(_Table(rows, rows, (one, two, one), (two, one, two)))
    # set 1 (of one needer) is unused: still every row's needers are two or more
    assert not reduce._one_holder_broadcasts(_Table(rows, rows, (two, one, one),
                                                    (two, one, two)))
    assert not reduce._one_holder_broadcasts(_Table(rows[:0], rows[:0], (one,), (two,)))

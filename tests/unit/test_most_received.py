"""The device the most tasks send to, counted as one array (issue 62, round eighteen):
:func:`serial_floor.most_received` from :data:`serial_floor.COUNTED` receivers on
packs the tuples and counts them by ``bincount``; the same device a ``Counter``'s
most common gives (the first named among ties, none below 0), on varied cases."""

from __future__ import annotations

import random
from collections import Counter
from itertools import chain

import pytest

from reshard.planner.passes import serial_floor
from reshard.planner.passes.serial_floor import most_received


def _counted(receivers):
    """The ``Counter`` path: the first device not below 0 in its most-common order."""
    return next((d for d, _ in Counter(chain.from_iterable(receivers)).most_common()
                 if d >= 0), None)


@pytest.mark.parametrize("seed", range(40))
def test_the_arrays_name_the_counters_device(seed, monkeypatch):
    rng = random.Random(seed)
    high = rng.choice([2, 5, 40, 3000])
    lengths = rng.choice([[0, 1, 2], [3], [1, 64], [200]])
    receivers = [tuple(rng.randrange(-3, high) for _ in range(rng.choice(lengths)))
                 for _ in range(rng.randint(0, 120))]
    if rng.random() < 0.5:  # ties: every tuple a permutation of one set
        devices = rng.sample(range(high + 40), 12)
        receivers = [tuple(rng.sample(devices, len(devices))) for _ in range(30)]
    want = _counted(receivers)
    monkeypatch.setattr(serial_floor, "COUNTED", 0)
    assert most_received(receivers) == want


def test_none_where_no_device_is_named(monkeypatch):
    monkeypatch.setattr(serial_floor, "COUNTED", 0)
    assert most_received([]) is None
    assert most_received([(), (-1, -2)]) is None


def test_the_first_named_among_ties():
    receivers = [tuple(range(500, 0, -1))] * (serial_floor.COUNTED // 500 + 1)
    assert most_received(receivers) == 500  # every device as often: the first named
    assert most_received([*receivers, (7,)]) == 7

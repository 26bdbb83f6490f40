"""``estimates.key_bytes`` counts a container's plain ints in place
(``_items_bytes``): the same bytes as the call per item it replaces."""

from __future__ import annotations

import dataclasses
import enum
import random
import sys

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.estimates import _SHARED_INTS, key_bytes, normal_form
from reshard.planner.values.strategy import Strategy


def _reference(key, seen=None):
    """key_bytes as it was: a call per item."""
    seen = set() if seen is None else seen
    if id(key) in seen or key is None or isinstance(key, (bool, enum.Enum)) or \
            (type(key) is int and key in _SHARED_INTS):
        return 0
    seen.add(id(key))
    if isinstance(key, Cluster):
        return key.footprint
    size = sys.getsizeof(key)
    if isinstance(key, (tuple, list, frozenset, set)):
        return size + sum(_reference(k, seen) for k in key)
    if isinstance(key, dict):
        return size + sum(_reference(k, seen) + _reference(v, seen) for k, v in key.items())
    if dataclasses.is_dataclass(key) and not isinstance(key, type):
        return size + sum(_reference(getattr(key, f.name), seen)
                          for f in dataclasses.fields(key))
    return size


def _random_key(rng, depth=0):
    pick = rng.randrange(8 if depth < 3 else 4)
    if pick == 0:
        return rng.choice([rng.randint(-10, 300), rng.randint(-(1 << 70), 1 << 70), True])
    if pick == 1:
        return rng.choice(["", "bfloat16", "S0R+P1" * rng.randint(1, 30), 2.5, None])
    if pick == 2:
        return Strategy.BROADCAST
    if pick == 3:
        big = rng.randint(1000, 1 << 40)
        return (big, big, rng.randint(1000, 1 << 40))  # one int object twice: counted once
    items = [_random_key(rng, depth + 1) for _ in range(rng.randint(0, 6))]
    if pick == 4:
        return tuple(items)
    if pick == 5:
        return items
    if pick == 6:
        return frozenset(x for x in items if isinstance(x, (int, str)))
    return {i: x for i, x in enumerate(items)}


def test_key_bytes_equal_the_call_per_item():
    rng = random.Random(62)
    for _ in range(2000):
        key = _random_key(rng)
        shared = [key, key] if rng.random() < 0.2 else key  # the same object twice
        assert key_bytes(shared) == _reference(shared)


def test_an_estimates_keys_weigh_as_before():
    cluster = Cluster.preset("dgx-h100", 8)
    a, b = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))
    for src, dst in (("S0R+P1", "RR"), ("RS0", "S1R"), ("RR", "S01R")):
        s, d = Layout(a, src), Layout(b, dst)
        exact = ((8192, 8192), "bfloat16", s, d, cluster, Strategy.BROADCAST, None)
        assert key_bytes(exact) == _reference(exact) > 0
        normal = normal_form((8192, 8192), "bfloat16", s, d, cluster, Strategy.BROADCAST, None)
        assert key_bytes(normal.key) == _reference(normal.key) > 0

"""OrderKeys.concat's shortcut (one part with rows: that part itself) against the
concatenation it replaces: the same columns, the same order."""

from __future__ import annotations

import dataclasses

import numpy as np

from reshard.planner.schedule import order


def _keys(rng, n, width):
    return order.OrderKeys(
        rng.integers(0, 3, n), rng.integers(0, 3, n), rng.integers(0, 8, n),
        rng.choice([8, 1 << 20, 1 << 33], n), rng.integers(0, 2, n),
        rng.integers(0, 1 << 16, (n, width)), rng.integers(-1, 2048, n), rng.permutation(n))


def _concatenated(parts):
    width = max(p.box.shape[1] for p in parts)
    cols = {f.name: np.concatenate([getattr(p, f.name) for p in parts])
            for f in dataclasses.fields(order.OrderKeys) if f.name != "box"}
    box = np.concatenate([np.pad(p.box, ((0, 0), (0, width - p.box.shape[1])))
                          for p in parts])
    return order.OrderKeys(box=box, **cols)


def _same(a, b):
    for f in dataclasses.fields(order.OrderKeys):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert x.dtype == y.dtype and np.array_equal(x, y)
    assert np.array_equal(a.order(), b.order())


def test_concat_of_one_part_with_rows_is_that_part():
    rng = np.random.default_rng(3)
    keys = _keys(rng, 300, 4)
    empty = _keys(rng, 0, 0)
    for parts in ([empty, keys], [keys, empty], [keys]):
        got = order.OrderKeys.concat(parts)
        assert got is keys
        _same(got, _concatenated(parts))
    wider = _keys(rng, 0, 6)  # an empty part with wider boxes: padded, a new object
    got = order.OrderKeys.concat([wider, keys])
    assert got is not keys and got.box.shape[1] == 6
    _same(got, _concatenated([wider, keys]))
    _same(order.OrderKeys.concat([keys, keys]), _concatenated([keys, keys]))

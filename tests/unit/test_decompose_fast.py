"""Fast paths of planner/cells/decompose.py against the paths they replace:
``decompose(..., held_only=True)`` (what ``decompose_pieces`` reads per reduction
step) against the whole decomposition filtered afterwards; ``new_cell`` against the
dataclass's constructor; ``_unions`` against the loop over every bit."""

from __future__ import annotations

import random

from reshard import DeviceMesh, Layout
from reshard.planner.cells.decompose import Cell, _unions, decompose, devices_by_box, new_cell
from reshard.planner.cells.reduce import decompose_pieces


def _filtered(shape, holders, needers):
    return [c for c in decompose(shape, holders, needers) if c.holders]


def _random_boxes(rng, shape, n, devices):
    out = {}
    for _ in range(n):
        box = []
        for s in shape:
            a, b = sorted(rng.sample(range(s + 1), 2))
            box.append((a, b))
        out[tuple(box)] = frozenset(rng.sample(devices, rng.randint(1, 3)))
    return out


def test_held_only_cells_equal_the_whole_decomposition_filtered():
    rng = random.Random(62)
    checked = 0
    for _ in range(400):
        ndim = rng.randint(1, 3)
        shape = tuple(rng.randint(1, 12) for _ in range(ndim))
        # holders cover only part of the tensor (a reduction step's pieces), needers
        # overlap each other and the holders arbitrarily
        holders = _random_boxes(rng, shape, rng.randint(0, 4), list(range(8)))
        needers = _random_boxes(rng, shape, rng.randint(1, 5), list(range(8, 16)))
        got = decompose(shape, holders, needers, held_only=True)
        want = _filtered(shape, holders, needers)
        assert got == want
        assert [c.size for c in got] == [c.size for c in want]
        checked += bool(want) and len(want) < len(decompose(shape, holders, needers))
    assert checked > 50  # most draws leave out some cells no one holds


def test_held_only_of_a_scalar_and_of_no_holders():
    needers = {(): frozenset({3})}
    assert decompose((), {(): frozenset({1})}, needers, held_only=True) == \
        _filtered((), {(): frozenset({1})}, needers)
    assert decompose((), {}, needers, held_only=True) == []
    assert decompose((4,), {}, {((0, 4),): frozenset({3})}, held_only=True) == []


def test_pieces_reduced_at_several_steps_keep_their_cells():
    """decompose_pieces over layouts, each source box ready at its own step."""
    rng = random.Random(7)
    specs = ["RR", "S0R", "RS0", "S1R", "RS1", "S0S1", "S01R", "RS10"]
    for _ in range(80):
        shape = (rng.randint(1, 40), rng.randint(1, 40))
        src = Layout(DeviceMesh((2, 4), range(8)), rng.choice(specs))
        dst = Layout(DeviceMesh((4, 2), range(20, 28)), rng.choice(specs))
        holders, needers = devices_by_box(src, shape), devices_by_box(dst, shape)
        ready = {b: rng.randint(0, 3) for b in holders}
        cells, steps = decompose_pieces(shape, holders, needers, ready)
        by_step: dict[int, dict] = {}
        for box, devs in holders.items():
            by_step.setdefault(ready.get(box, 0), {})[box] = devs
        if len(by_step) == 1:
            continue
        old = sorted(((c, s) for s, part in by_step.items()
                      for c in _filtered(shape, part, needers)), key=lambda cs: cs[0].box)
        assert cells == [c for c, _ in old] and steps == [s for _, s in old]


def test_a_new_cell_is_the_constructors_cell():
    rng = random.Random(3)
    for _ in range(200):
        box = tuple(sorted(rng.sample(range(30), 2)) for _ in range(rng.randint(0, 3)))
        box = tuple((a, b) for a, b in box)
        holders = frozenset(rng.sample(range(9), rng.randint(0, 3)))
        needers = frozenset(rng.sample(range(9, 20), rng.randint(1, 4)))
        fast, slow = new_cell(box, holders, needers), Cell(box, holders, needers)
        assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
        assert list(fast.__dict__.items()) == list(slow.__dict__.items())  # order too
        assert type(fast) is Cell and fast.size == slow.size


def _unions_bit_by_bit(masks, sets):
    out = {}
    for mask in masks:
        acc = set()
        i, m = 0, mask
        while m:
            if m & 1:
                acc |= sets[i]
            m >>= 1
            i += 1
        out[mask] = frozenset(acc)
    return out


def test_unions_equal_the_loop_over_every_bit_in_iteration_order_too():
    rng = random.Random(11)
    for _ in range(200):
        sets = [frozenset(rng.sample(range(200), rng.randint(1, 40)))
                for _ in range(rng.randint(1, 70))]
        masks = {rng.getrandbits(len(sets)) for _ in range(10)}
        got, want = _unions(masks, sets), _unions_bit_by_bit(masks, sets)
        assert got == want
        assert all(list(got[m]) == list(want[m]) for m in masks)  # built in one order

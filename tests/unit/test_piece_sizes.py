"""The pieces' bytes both allgather floors read
(:func:`~reshard.planner.schedule.held_receipts.piece_sizes`, issue 62 round
seventeen): kept by a box's extents, one memo for every cell of a floor, the same sizes
as splitting each box itself (:func:`~reshard.planner.cells.cell_tasks.split_box`), on
random boxes of shared extents at other offsets, uneven extents and more pieces than
elements; and the floors' rows the same as with each cell's box split anew."""

from __future__ import annotations

import random

import pytest

from reshard.layout import box_size
from reshard.planner.cells.cell_tasks import split_box
from reshard.planner.cuts import cut_slices
from reshard.planner.passes import gather_floor
from reshard.planner.schedule import floors
from reshard.planner.schedule.floors import _counted
from reshard.planner.schedule.held_receipts import piece_sizes
from reshard.planner.values.strategy import Strategy

from .test_held_allgather_floor import CASES, H100, SMALL, _tensors


def _fresh(box, k, item, known=None):
    return [box_size(p) * item for p in split_box(box, k)]


def _boxes(rng: random.Random, n: int):
    extents = [(rng.choice([1, 3, 7, 64, 1000]), rng.choice([2, 5, 4096, 4097]))
               for _ in range(6)]
    for _ in range(n):
        ext = rng.choice(extents)
        lo = [rng.randrange(50000) for _ in ext]
        yield tuple((a, a + e) for a, e in zip(lo, ext))


def test_the_sizes_of_every_box_as_split_anew():
    rng = random.Random(17)
    known: dict = {}
    for box in _boxes(rng, 2000):
        k, item = rng.choice([1, 2, 3, 4, 8, 9, 5000]), rng.choice([1, 2, 4])
        assert piece_sizes(box, k, item, known) == _fresh(box, k, item)
    assert len(known) < 2000  # boxes of one extents share an entry


@pytest.mark.parametrize("box", [(), ((0, 0), (0, 5)), ((3, 4),), ((10, 13), (0, 1))])
def test_empty_and_small_boxes(box):
    known: dict = {}
    for k in (1, 2, 5):
        for item in (1, 2):
            assert piece_sizes(box, k, item, known) == _fresh(box, k, item)
            assert piece_sizes(box, k, item, known) == _fresh(box, k, item)


@pytest.mark.parametrize("src,dst,shape,how", CASES)
@pytest.mark.parametrize("cluster", [H100, SMALL], ids=["h100", "small"])
def test_the_floors_rows_and_receipts_as_with_each_box_split_anew(src, dst, shape, how,
                                                                  cluster, monkeypatch):
    dims = (4, 8) if cluster is H100 else (2, 3)
    s = cut_slices(_tensors(src, dst, shape, how, cluster, dims), cluster, Strategy.ALLGATHER)

    def both():
        flows = _counted(s.work, s.itemsizes, cluster, Strategy.ALLGATHER, False)
        rows = [getattr(flows, k).rows for k in ("dev_out", "dev_in", "nic_out", "nic_in")]
        return rows, dict(gather_floor.receipts(s.work, s.itemsizes, cluster))

    got = both()
    monkeypatch.setattr(floors, "piece_sizes", _fresh)
    monkeypatch.setattr(gather_floor, "piece_sizes", _fresh)
    want = both()
    assert got[0] == want[0] and list(got[1].items()) == list(want[1].items())
    assert got[1]  # receipts counted

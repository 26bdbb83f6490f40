"""Cheaper assembly of a work list (planner/schedule/work.py, planner/cuts.py) against
the paths it replaces: add_cells with ``whole_below`` (cells the splitter would leave
whole added without asking it; every cell whole: the lists extended at once) against
the splitter asked for every cell, a cell's pieces built by ``new_cell`` against the
dataclass's constructor, and the work list's host and NIC arrays against
the cluster's ``host_of`` / ``nic_of`` device by device (sparse, unordered ids too)."""

from __future__ import annotations

import random

import pytest

from reshard.cluster import Cluster
from reshard.layout import box_size
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.cell_tasks import split_box
from reshard.planner.cells.decompose import Cell
from reshard.planner.cuts import _split_in, _splitter, balance_piece
from reshard.planner.schedule.work import WorkList
from tests.unit._regular_clusters import regular_clusters


def _state(wl):
    return (list(wl._nbytes), list(wl._after), list(wl._ref), list(wl.general),
            dict(wl._last_step))


def _cells(rng, devices, n, big):
    """``n`` cells of one column each, some (``big``) long enough to split."""
    out = []
    for k in range(n):
        rows = rng.choice([1, 3, 1 << 12, 1 << 18, 1 << 22]) if big else rng.choice([1, 7])
        out.append(Cell(((0, rows), (k, k + 1)),
                        frozenset(rng.sample(devices, rng.choice([1, 1, 2]))),
                        frozenset(rng.sample(devices, rng.choice([1, 2, 5, 9])))))
    if big:  # one cell at least that splits: over the NICs of a host it enters
        out[0] = Cell(((0, 1 << 22), (0, 1)), frozenset(devices[:1]),
                      frozenset(devices[8:17]))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", ["preset", "pieces", "two-nics"])
@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("short", [None, "after", "cells"])
def test_whole_below_is_the_splitter_asked_for_every_cell(seed, name, big, short):
    cluster = regular_clusters(4, 8)[name]
    devices = list(cluster.devices)
    min_piece = balance_piece(cluster)
    states, added = [], 0
    for whole_below in (0, 2 * min_piece):
        rng = random.Random(seed)
        loads = Loads(cluster)
        wl = WorkList(cluster, loads)
        for tensor in range(3):
            item = rng.choice([1, 2, 4])
            cells = _cells(rng, devices, rng.randrange(1, 30), big and tensor != 1)
            after = [rng.randrange(3) for _ in cells]
            if short == "after":
                after = after[:len(after) // 2]
            elif short == "cells":
                after = [*after, 5, 5]
            added += min(len(cells), len(after))
            wl.add_cells(tensor, cells, item, after, _splitter(item, loads, min_piece),
                         whole_below=whole_below)
        states.append(_state(wl))
    assert states[0] == states[1]
    if big:  # some cell was cut into pieces
        assert len(states[0][3]) > added // 2 > 0


def _clusters():
    ids = list(range(0, 200, 3))
    random.Random(1).shuffle(ids)
    sparse = Cluster(tuple(tuple(ids[h * 6:h * 6 + 6]) for h in range(8)), nics_per_host=2)
    return [*regular_clusters(3, 8).values(), sparse, Cluster(((5,),))]


@pytest.mark.parametrize("cluster", _clusters())
def test_host_and_nic_arrays_are_the_cluster_s(cluster):
    wl = WorkList(cluster, Loads(cluster))
    size = max(cluster.devices) + 1
    assert len(wl._host) == len(wl._nic) == size
    for d in range(size):
        if d in cluster.host_map:
            assert wl._host[d] == cluster.host_of(d) and wl._nic[d] == cluster.nic_of(d)
        else:
            assert wl._host[d] == 0 and wl._nic[d] == 0


@pytest.mark.parametrize("name", ["preset", "pieces", "two-nics"])
@pytest.mark.parametrize("item", [1, 2, 4])
@pytest.mark.parametrize("near", [-1, 0, 1])
def test_whole_below_at_the_threshold(name, item, near):
    """Cells of exactly, just under and just over the bytes under which the splitter
    leaves a cell whole (each one that splits when it may: one holder, needers over
    a host's NICs), alone or after smaller ones: the same slices."""
    cluster = regular_clusters(4, 8)[name]
    devices = list(cluster.devices)
    min_piece = balance_piece(cluster)
    rows = 2 * min_piece // item + near
    cell = Cell(((0, rows), (0, 1)), frozenset(devices[:1]), frozenset(devices[8:17]))
    small = Cell(((0, 3), (1, 2)), frozenset(devices[:1]), frozenset(devices[8:17]))
    states = []
    for whole_below in (0, 2 * min_piece):
        loads = Loads(cluster)
        wl = WorkList(cluster, loads)
        split = _splitter(item, loads, min_piece)
        wl.add_cells(0, [cell], item, [0], split, whole_below=whole_below)
        wl.add_cells(1, [small, cell, small], item, [1, 0, 2], split, whole_below=whole_below)
        states.append(_state(wl))
    assert states[0] == states[1]
    split_up = rows * item >= 2 * min_piece
    assert (len(states[0][3]) > 5) is split_up


BOXES = [((0, 100), (0, 8)), ((0, 3), (5, 6)), ((7, 9),), ((0, 5), (0, 2), (3, 4)),
         ((0, 1), (0, 1)), ((10, 10), (0, 4)), ()]


@pytest.mark.parametrize("box", BOXES)
@pytest.mark.parametrize("k", [1, 2, 3, 4, 7, 16])
def test_split_pieces_are_the_constructors_cells(box, k):
    """Every non-empty piece (trailing pieces of a short dim are empty), as the
    dataclass builds it: the same fields, size and order; the whole cell below 2."""
    cell = Cell(box, frozenset({0, 3}), frozenset({9}))
    want = [cell] if k < 2 else [Cell(b, cell.holders, cell.needers)
                                 for b in split_box(box, k) if box_size(b)]
    got = _split_in(cell, k)
    assert got == want
    assert [(c.box, c.holders, c.needers, c.size) for c in got] == \
        [(c.box, c.holders, c.needers, c.size) for c in want]
    assert [vars(c) for c in got] == [vars(c) for c in want]

"""Round seventeen's bulk steps of a partial source's grid and reductions against
brute-force oracles (issue 62): each extent's pieces (``decompose._members``) against
grouping them one by one; the covering sets of a dim's intervals
(``_PieceSets.covering``) against every piece tested on every interval, new ids in
the order their intervals come; a table's set numbering (``decompose._numbered``,
:meth:`~reshard.planner.cells.decompose.CellTable.from_cells`) against numbering each
set as it first comes; and a reduction's shares counted by member
(``gather_shares.COUNT_FROM``) against gathering each share one by one, groups with
repeated members and many roots included."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard import Cluster
from reshard.planner.cells import decompose as dec
from reshard.planner.cells import gather_shares as gs
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.decompose import Cell, CellTable


@pytest.mark.parametrize("seed", range(6))
def test_each_extents_pieces(seed):
    rng = random.Random(seed)
    for _ in range(50):
        n = rng.randint(1, 9)
        which = np.array([rng.randrange(n) for _ in range(rng.randint(n, 60))], dtype=np.int64)
        want: dict[int, list[int]] = {e: [] for e in range(n)}
        for i, e in enumerate(which.tolist()):
            want[e].append(i)
        got = dec._members(which, n)
        assert got == [frozenset(want[e]) for e in range(n)]
        assert all(type(i) is int for s in got for i in s)


@pytest.mark.parametrize("seed", range(6))
def test_the_covering_sets_of_every_interval(seed):
    rng = random.Random(40 + seed)
    for _ in range(60):
        size = rng.randint(1, 40)
        pieces = rng.randint(1, 30)
        piece_lo, piece_hi = [], []
        for _ in range(pieces):  # shared extents, whole-dim pieces and nested ones
            a = rng.choice([0, rng.randrange(size)])
            b = rng.choice([size, rng.randint(a + 1, size)])
            piece_lo.append(a)
            piece_hi.append(b)
        pts = sorted({0, size, *piece_lo, *piece_hi})
        keep = sorted(rng.sample(range(len(pts) - 1), rng.randint(1, len(pts) - 1)))
        lo = np.array([pts[i] for i in keep], dtype=np.int64)
        hi = np.array([pts[i + 1] for i in keep], dtype=np.int64)
        sets = dec._PieceSets([frozenset({p % 5}) for p in range(pieces)])
        ids = sets.covering(lo, hi, np.array(piece_lo, dtype=np.int64),
                            np.array(piece_hi, dtype=np.int64)).tolist()
        order = [sets.nothing, sets.everything]
        for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist())):
            want = frozenset(p for p in range(pieces) if piece_lo[p] <= a and b <= piece_hi[p])
            assert sets.sets[ids[i]] == want
            if ids[i] not in order:
                order.append(ids[i])
        assert order == sorted(order)  # new sets numbered as their intervals come


def _numbered_one_by_one(sets):
    ids: dict = {}
    return [ids.setdefault(s, len(ids)) for s in sets], tuple(ids)


@pytest.mark.parametrize("seed", range(4))
def test_a_tables_sets_numbered_as_they_first_come(seed):
    rng = random.Random(80 + seed)
    for _ in range(40):
        pool = [frozenset(rng.sample(range(9), rng.randint(0, 3))) for _ in range(6)]
        sets = [frozenset(rng.choice(pool)) for _ in range(rng.randint(0, 50))]  # equal, not same
        got, named = dec._numbered(sets)
        want, want_named = _numbered_one_by_one(sets)
        assert got.dtype == np.int64 and got.tolist() == want and named == want_named
        assert all(a is b for a, b in zip(named, want_named))  # the first of its equals
        cells = [Cell(((i, i + 1), (0, 2)), s, pool[i % 6]) for i, s in enumerate(sets)]
        if cells:
            table = CellTable.from_cells(cells, 2)
            assert table.holder.tolist() == want and table.holder_sets == want_named
            assert table.cells() == cells


def _tables(loads):  # as test_gather_shares reads them (the bulk path may add 0.0)
    return [{k: v for k, v in t.items() if v}
            for t in (loads.dev_out, loads.dev_in, loads.nic_out, loads.nic_in)]


@pytest.mark.parametrize("count_from", [1, 16, 10 ** 9])
def test_many_roots_counted_by_member(monkeypatch, count_from):
    monkeypatch.setattr(gs, "COUNT_FROM", count_from)
    cluster = Cluster.preset("aws-p4d.24xlarge", 8)  # 64 devices, 2 a NIC
    rng = random.Random(count_from % 97)
    for _ in range(80):
        group = tuple(rng.choice(range(64)) for _ in range(rng.randint(2, 64)))  # repeats
        shares = [(rng.choice(group), rng.randint(1, 1 << 20))
                  for _ in range(rng.randint(1, 120))]
        one, bulk = Loads(cluster), Loads(cluster)
        for root, nbytes in shares:
            gs.gather(one, tuple(d for d in group if d != root), root, nbytes)
        gs.gather_shares(bulk, group, shares)
        assert _tables(bulk) == _tables(one)

"""Balance pieces of a cell (planner/cuts.py): the NICs a needing host receives through
are found once per distinct set of needers, with the answer of the direct count."""

from __future__ import annotations

import random

from reshard import Cluster
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.decompose import Cell
from reshard.planner.cuts import _balance_pieces


def _direct(cell: Cell, nbytes: int, loads: Loads, min_piece: int) -> int:
    """The count written out plainly: every needer that holds nothing, per host."""
    if nbytes < 2 * min_piece:
        return 1
    hold = len({loads.nic(d) for d in cell.holders})
    per_host: dict[int, set[int]] = {}
    for d in cell.needers - cell.holders:
        per_host.setdefault(loads.host(d), set()).add(loads.nic(d))
    most = max((len(v) for v in per_host.values()), default=1)
    k = min(16, max(hold, most), nbytes // min_piece)
    return 1 if k < 2 or not per_host else k


def test_memoised_balance_pieces_equal_the_direct_count_on_random_cells():
    cluster = Cluster.preset("aws-p4d.24xlarge", 4)  # 32 devices, 4 NICs a host
    loads = Loads(cluster)
    rng = random.Random(62)
    memo: dict[frozenset[int], int] = {}
    pool = [frozenset(rng.sample(range(32), rng.randint(1, 20))) for _ in range(12)]
    overlapping = 0
    for _ in range(600):
        holders = frozenset(rng.sample(range(32), rng.randint(1, 6)))
        needers = rng.choice(pool)
        overlapping += not holders.isdisjoint(needers)
        cell = Cell(((0, 8),), holders, needers)
        nbytes = rng.choice([10, 1 << 17, 1 << 20, 1 << 24])
        want = _direct(cell, nbytes, loads, 1 << 16)
        assert _balance_pieces(cell, nbytes, loads, 1 << 16, memo) == want
        assert _balance_pieces(cell, nbytes, loads, 1 << 16) == want
    assert overlapping > 50 and len(memo) > 5

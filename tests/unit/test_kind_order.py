"""expect_runs._kind_order (planner/cells/expect_runs.py, issue 62 round eighteen: a
run's kinds numbered by a table of first places) against what it replaces: the bytes and
hosts numbered by ``first_order`` and the joint code numbered by ``first_order`` again
(each a sort). The same kinds and first cells over runs of one or several sizes, hosts
with and without -1, sets used or not, and with the table refused (the sort path); and
whole runs of expectations against the cell-by-cell kinds."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.cells import expect_runs
from reshard.planner.cells.set_codes import first_order
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import expect_cells, load_tables, twin_loads


def _sorted_kinds(ncode, nb, at):
    """The kinds as expect_runs numbered them before (three sorts)."""
    at, at_first = first_order(at)
    sizes, size_first = first_order(nb)
    return first_order((ncode * len(size_first) + sizes) * len(at_first) + at)


def _columns(rng, n, nsets, sizes, hosts):
    ncode = np.array([rng.randrange(nsets) for _ in range(n)], dtype=np.int64)
    values = rng.sample([8192, 1000, 3 << 40, 7, 65536], sizes)
    nb = np.array([rng.choice(values) for _ in range(n)], dtype=np.int64)
    at = np.array([rng.choice(hosts) for _ in range(n)], dtype=np.int64)
    return ncode, nb, at


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("sizes", [1, 2, 5])
@pytest.mark.parametrize("hosts", [[-1], [-1, 0, 3], [2, 5, 7, 30], [0]])
@pytest.mark.parametrize("table", [True, False])
def test_kind_order_is_the_sorts(seed, sizes, hosts, table, monkeypatch):
    rng = random.Random(seed)
    n = rng.choice([1, 17, 600, 3000]) if table else rng.choice([1, 9])
    nsets = rng.choice([1, 4, 40]) if table else 40
    ncode, nb, at = _columns(rng, n, nsets, sizes, hosts)
    sorts = []
    if not table:  # the codes' bound over the table's and 4 a cell: the sort path
        monkeypatch.setattr(expect_runs, "DENSE_KINDS", 0)
        monkeypatch.setattr(expect_runs, "first_order",
                            lambda codes: sorts.append(1) or first_order(codes))
    got = expect_runs._kind_order(ncode, nsets + rng.choice([0, 3]), nb, at)
    assert len(sorts) == (not table)
    want = _sorted_kinds(ncode, nb, at)
    assert got is not None
    assert got[0].tolist() == want[0].tolist()
    assert got[1].tolist() == want[1].tolist()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics"])
@pytest.mark.parametrize("mixed", [False, True])
def test_kinds_bulk_of_sizes_is_kinds(seed, variant, mixed):
    """Runs of one or two sizes (``mixed``: some of 1,000 bytes and some of two holders,
    where both decline), their kinds as the cell-by-cell loop finds them."""
    rng = random.Random(seed)
    cluster = regular_clusters(6, 8)[variant]
    a, b = twin_loads(rng, cluster, False)
    cells, nbytes = expect_cells(rng, cluster, 700, mixed=mixed)
    want = expect_runs._kinds(a, cells, nbytes)
    got = expect_runs._kinds_bulk(b, cells, nbytes)
    assert (want is None) == (got is None)
    if want is not None and got is not None:
        assert got[0] == want[0]
        assert got[1].tolist() == want[1].tolist() and got[2].tolist() == want[2].tolist()
    assert load_tables(a) == load_tables(b)


@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics"])
@pytest.mark.parametrize("seed", range(3))
def test_a_holder_that_sends_into_its_own_host_only_names_no_nic(variant, seed):
    """Cells whose needers are all on the holder's host send out of no NIC: their
    holders' NICs get no ``NIC_OUT`` key (only the NICs some cell sends out of do)."""
    from reshard.planner.cells.decompose import Cell

    rng = random.Random(seed)
    cluster = regular_clusters(6, 8)[variant]
    a, b = twin_loads(rng, cluster, False)
    hosts = cluster.hosts
    cells, nbytes = [], []
    for k in range(expect_runs.MIN_RUN + 10):
        if k % 3:  # from host 0 into host 0 alone
            holder, needers = hosts[0][0], frozenset(hosts[0][1:rng.randint(3, 8)])
        else:  # from host 1 to hosts 2 and 3
            holder = rng.choice(hosts[1])
            needers = frozenset(hosts[2][:2] + hosts[3][:rng.randint(2, 8)])
        cells.append(Cell(((0, 1), (k, k + 1)), frozenset({holder}), needers))
        nbytes.append(rng.choice([840, 840 * 16]))
    for cell, nb in zip(cells, nbytes):
        a.expect(cell.holders, cell.needers - cell.holders, nb)
    assert expect_runs.expect_run(b, cells, nbytes)
    assert dict(a.expected) == dict(b.expected)

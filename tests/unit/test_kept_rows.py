"""A table's one-holder rows kept as columns (planner/schedule/kept_rows.py,
planner/cells/broadcast_rows.py, expect_runs.expect_coded, reduce's table kept) against
the paths they replace: plan_rows against broadcast_runs.plan_run of the rows' cells,
KeptRows.expect against expect_run, a work list of kept rows against one of the same
cells (the same tasks, order and loads), and a cut's table against its cells."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard.planner.cells import broadcast_runs, cell_tasks, decompose, expect_runs, reduce
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.broadcast_rows import plan_rows
from reshard.planner.cells.decompose import Cell, CellTable
from reshard.planner.schedule import kept_rows, work
from reshard.planner.schedule.kept_rows import KeptRows, uncut
from reshard.planner.schedule.work import WorkList
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import assert_same_loads, load_tables, twin_loads

HOSTS, GPUS = 6, 8


def _rows(rng, cluster, n, flaw=None, whole=False):
    """``n`` one-holder cells, each to a receiver set on another host (one set per
    host: they share no NIC), in a table (sets shared, as decompose's); ``flaw``:
    one cell that makes plan_run decline ("own-host": a root sending into its own
    host; "two-holders"; "shared-nic": two sets on one host); ``whole``: each set a
    whole host and the roots every device of host 0 in turn, every cell 840 bytes at
    two an element (whole shares over 1..8 NICs: expectations in bulk; with ``n`` a
    multiple of 8, every NIC of a host expected to carry as much: none may relay)."""
    hosts = cluster.hosts
    sets = {h: frozenset(hosts[h] if whole else
                         rng.sample(hosts[h], rng.randint(2, len(hosts[h]) - 1)))
            for h in range(1, len(hosts))}
    roots = rng.sample(hosts[0], 3)
    cells = []
    for k in range(n):
        h = rng.randrange(1, len(hosts))
        holders = frozenset({hosts[0][k % len(hosts[0])] if whole else rng.choice(roots)})
        needers = sets[h]
        if flaw is not None and k == n // 2:
            if flaw == "own-host":  # a device of the receivers' host, or a root
                others = sorted(set(hosts[h]) - needers)  # they send to, on their host
                holders = frozenset({others[0]}) if others else \
                    frozenset({hosts[0][1]})
                if not others:
                    needers = frozenset(hosts[0][2:])
            elif flaw == "two-holders":
                holders = frozenset(roots[:2])
            else:
                needers = frozenset(set(hosts[h]) - needers) | {min(needers)}
        box = ((0, 420), (4 * k, 4 * k + 1)) if whole else \
            ((0, rng.choice([1, 3, 64])), (4 * k, 4 * k + rng.choice([1, 2])))
        cells.append(Cell(box, holders, needers))
    return CellTable.from_cells(cells, 2)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics"])
@pytest.mark.parametrize("flaw", [None, "own-host", "two-holders", "shared-nic"])
def test_plan_rows_is_plan_run_of_the_cells(seed, variant, flaw):
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    a, b = twin_loads(rng, cluster, seed % 2 == 1)
    table = _rows(rng, cluster, broadcast_runs.MIN_RUN + 30, flaw)
    rows = np.array(rng.sample(range(len(table)), len(table)), dtype=np.int64)  # any order
    steps = [rng.randrange(3) for _ in rows]
    cells = table.cells(rows)
    want = broadcast_runs.plan_run([(c, 1, 2, s) for c, s in zip(cells, steps)], a)
    before = load_tables(b)[:4]
    got = plan_rows(table, rows, 1, 2, steps, b)
    assert got == want
    if want is None:
        assert load_tables(b)[:4] == before
    else:
        assert_same_loads(a, b, expected_order=False)
    if flaw is None and variant != "two-nics" and seed % 2 == 0:
        assert got is not None  # planned by rounds (nothing crowds a NIC)


def test_plan_rows_declines_a_short_run():
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    table = _rows(random.Random(0), cluster, broadcast_runs.MIN_RUN - 1)
    rows = np.arange(len(table))
    assert plan_rows(table, rows, 0, 2, [0] * len(rows), Loads(cluster)) is None


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics"])
def test_kept_rows_expect_is_expect_run_of_the_cells(seed, variant):
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    a, b = twin_loads(rng, cluster, True)
    for loads in (a, b):  # whole expectations from before
        for key in list(loads.expected):
            loads.expected[key] = float(round(loads.expected[key]))
    table = _rows(rng, cluster, expect_runs.MIN_RUN + 20,
                  rng.choice([None, "own-host", "two-holders"]))
    nbytes = (table.size * rng.choice([2, 840])).tolist()
    want = expect_runs.expect_run(a, table.cells(), nbytes)
    got = KeptRows(0, table, 0).expect(b, nbytes)
    if got:
        assert want
    elif want:  # declined: the caller asks expect_run of the cells
        assert expect_runs.expect_run(b, table.cells(), nbytes)
    assert dict(a.expected) == dict(b.expected)
    assert (a.shared, a._epoch) == (b.shared, b._epoch)


def _planned(cluster, table, extra, keep, fan_out, seed):
    """A work list of tensor 0's ``extra`` cells and tensor 1's table (kept as rows,
    or its cells added one list), planned: its tasks, positions, loads, kept rows."""
    rng = random.Random(seed)
    wl = WorkList(cluster, Loads(cluster))
    if extra:
        wl.add_cells(0, extra, 2, [rng.randrange(2) for _ in extra], None)
    after = np.array([rng.randrange(3) for _ in range(len(table))], dtype=np.int64)
    if keep:
        wl.add_table(1, table, 2, after, None)
    else:
        wl.add_cells(1, table.cells(), 2, after.tolist(), None)
    kept = wl._rows is not None
    ordered = wl.plan(cell_tasks.plan_broadcast, [2, 2], expect=True, relays=True,
                      fan_out=fan_out)
    return ordered.tasks(), ordered.positions, wl.loads, kept, wl._rows is not None


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("variant", ["preset", "two-nics"])
@pytest.mark.parametrize("flaw", [None, "own-host"])
@pytest.mark.parametrize("extra", [False, True])
@pytest.mark.parametrize("fan_out", [False, True])
def test_a_work_list_of_kept_rows_plans_as_its_cells(seed, variant, flaw, extra, fan_out):
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    rng = random.Random(seed)
    table = _rows(rng, cluster, broadcast_runs.MIN_RUN + 48, flaw, whole=seed != 2)
    cells = [Cell(((0, 2), (k, k + 1)), frozenset({k % 7}), frozenset({9, 17, 30}))
             for k in range(20)] if extra else []
    want = _planned(cluster, table, cells, False, fan_out, seed)
    got = _planned(cluster, table, cells, True, fan_out, seed)
    assert got[:2] == want[:2]
    assert_same_loads(got[2], want[2], expected_order=False)
    assert got[3]  # kept as rows when added
    if flaw is None and not extra and variant == "preset" and seed != 2:
        assert got[4]  # planned from the columns: no cell built


def test_a_work_list_builds_kept_rows_as_cells_when_asked():
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    table = _rows(random.Random(1), cluster, 40)
    wl = WorkList(cluster, Loads(cluster))
    wl.add_cells(0, table.cells()[:3], 2, [0, 0, 0], None)
    wl.add_table(1, table, 2, np.zeros(len(table), dtype=np.int64), None)
    assert wl._rows is not None and len(wl._general) == 3
    assert [c for _, c in wl.general] == table.cells()[:3] + table.cells()
    assert [t for t, _ in wl.general] == [0] * 3 + [1] * len(table)
    assert wl._rows is None


def test_uncut_asks_the_splitter_per_kind_unless_every_row_is_under_its_whole_bound():
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    table = _rows(random.Random(2), cluster, 60)
    nbytes = table.size * 2
    asked = []

    def whole(cell, nb):
        asked.append(nb)
        return [cell]

    def cuts_big(cell, nb):
        return [cell] if nb < 100 else [cell, cell]

    assert uncut(table, nbytes, None)
    assert uncut(table, nbytes, cuts_big, whole_below=int(nbytes.max()) + 1)
    assert not uncut(table, nbytes, cuts_big)
    assert uncut(table, nbytes, whole) and asked
    assert not uncut(table, nbytes, lambda cell, nb: [Cell(cell.box, cell.holders,
                                                          cell.needers)])


def test_uncut_declines_many_kinds_unasked(monkeypatch):
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    table = _rows(random.Random(3), cluster, 60)
    monkeypatch.setattr(kept_rows, "KINDS_ASKED", 2)
    assert not uncut(table, table.size * 2, lambda cell, nb: [cell])


def test_the_cut_s_splitter_leaves_cells_under_its_whole_bound_whole():
    """cut_slices tells add_table that _splitter cuts no cell under two minimal pieces."""
    from reshard.planner import cuts
    cluster = regular_clusters(HOSTS, GPUS)["two-nics"]
    loads = Loads(cluster)
    split = cuts._splitter(2, loads, 1 << 10)
    rng = random.Random(4)
    devices = list(cluster.devices)
    for _ in range(50):
        cell = Cell(((0, 64), (0, 64)), frozenset(rng.sample(devices, 2)),
                    frozenset(rng.sample(devices, 9)))
        assert split(cell, (2 << 10) - 1) == [cell]


@pytest.mark.parametrize("hosts, shape", [(4, (4096, 1024)), (8, (4096, 1024)),
                                          (4, (16384, 4096))])  # the last: pieces cut
@pytest.mark.parametrize("pair", [("RR+P0", "RS0"), ("S0R+P1", "RS0"), ("RR+P01", "RS0")])
def test_a_cut_of_kept_rows_estimates_as_its_cells(hosts, shape, pair, monkeypatch):
    """A partial source's reduced pieces on ``hosts`` x 8 (their grid built with numpy:
    CELLS_FROM and the runs' least lengths lowered), the table kept, against the same cut's cells: the same
    seconds, and the kept rows planned from the columns at least once (where the run
    is planned by rounds)."""
    from reshard import Cluster, DeviceMesh, Layout
    from reshard.planner.cells import broadcast_rows
    from reshard.planner.estimates import CostCache, estimate_many
    monkeypatch.setattr(decompose, "CELLS_FROM", 4)
    monkeypatch.setattr(broadcast_runs, "MIN_RUN", 8)
    monkeypatch.setattr(broadcast_rows, "MIN_RUN", 8)
    monkeypatch.setattr(expect_runs, "MIN_RUN", 8)
    monkeypatch.setattr(work, "EXPECT_RUN", 8)
    n = hosts * 8
    a, b = DeviceMesh((hosts, 8), range(n)), DeviceMesh((hosts, 8), range(n, 2 * n))
    req = (shape, "bfloat16", Layout(a, pair[0]), Layout(b, pair[1]),
           Cluster.preset("dgx-h100", 2 * hosts))
    planned = []
    real = broadcast_rows.plan_groups

    def spy(found, loads):
        planned.append(len(found[1]))
        return real(found, loads)

    answers = []
    for kept in (True, False):
        with monkeypatch.context() as m:
            m.setattr(broadcast_rows, "plan_groups", spy)
            if not kept:
                m.setattr(reduce, "_one_holder_broadcasts", lambda table: False)
            answers.append(estimate_many([req], cache=CostCache()))
        if kept and pair[0] != "S0R+P1" and shape[0] < 16384:  # else not by rounds (S0R+P1
            # here: plan_run declines) or not kept (the big pieces are cut for balance)
            assert planned
        planned.clear()
    assert not planned
    assert answers[0] == answers[1]


@pytest.mark.parametrize("over", [False, True])
@pytest.mark.parametrize("fine", [False, True])
def test_cut_slices_of_a_table_are_those_of_its_cells(over, fine):
    """cut_slices of a cut whose cells are a table (kept where no row is cut for
    balance) against the same cut as a list of cells: the same slices (``over``: some
    rows just over the bound under which the splitter cuts nothing)."""
    from types import SimpleNamespace

    from reshard.planner import cuts
    from reshard.planner.values.strategy import Strategy
    cluster = regular_clusters(HOSTS, GPUS)["two-nics"]
    bound = 2 * cuts.balance_piece(cluster, fine)
    table = _rows(random.Random(5), cluster, 60)
    extent = np.where(np.arange(len(table)) % 7 == 3, bound // 2 + 1, bound // 4)
    lo = table.lo.copy()
    hi = np.stack([lo[:, 0] + (extent if over else bound // 4), lo[:, 1] + 1], axis=1)
    table = CellTable(lo, hi, np.prod(hi - lo, axis=1), table.holder, table.needer,
                      table.holder_sets, table.needer_sets)
    tensors = (SimpleNamespace(itemsize=2),)
    after = np.zeros(len(table), dtype=np.int64)
    got, want = (cuts.cut_slices(tensors, cluster, Strategy.BROADCAST, fine=fine,
                                 cut=cuts.Cut((cells,), (steps,), (), Loads(cluster)))
                 for cells, steps in ((table, after), (table.cells(), after.tolist())))
    assert (got.work._rows is None) == over
    assert got.work.general == want.work.general
    assert got.work.steps()[0] == want.work.steps()[0]
    assert len(want.work.general) > len(table) if over else len(want.work.general) == len(table)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("variant", ["preset", "pieces"])
def test_keyed_plan_s_order_keys_are_those_of_its_tasks(seed, variant):
    """KeptRows.keyed_plan's keys read from the columns against OrderKeys.of_tasks of
    the tasks it planned (every column; seq aside), rows in a shuffled order."""
    import dataclasses

    from reshard.planner.schedule.order import OrderKeys
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    loads, _ = twin_loads(rng, cluster, False)
    table = _rows(rng, cluster, broadcast_runs.MIN_RUN + 48, whole=True)
    start = rng.choice([0, 3])
    refs = [-1 - start - r for r in rng.sample(range(len(table)), len(table))]
    steps = [rng.randrange(3) for _ in refs]
    got = KeptRows(1, table, start).keyed_plan(refs, steps, 2, loads)
    assert got is not None
    cols, keys = got
    flat = [t for (t,) in cols.tasks()]
    assert cols.tasks() == KeptRows(1, table, start).plan(refs, steps, 2,
                                                           twin_loads(random.Random(seed),
                                                                      cluster, False)[0])
    want = OrderKeys.of_tasks(flat, np.zeros(len(flat), dtype=np.int64), cluster)
    for f in dataclasses.fields(OrderKeys):
        a, b = getattr(keys, f.name), getattr(want, f.name)
        assert a.dtype == b.dtype and np.array_equal(a, b), f.name
    assert len(set(keys.dist.tolist())) > 1 and len(set(keys.step.tolist())) > 1

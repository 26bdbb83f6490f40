"""The broadcast fast paths (planner/cells/broadcast_runs.py, cell_tasks.plan_broadcasts
and _one_host_chain, work._Demand's one-holder demand) against the paths they replace:
the same tasks in the same order, the same loads (floats and key order) left behind."""

from __future__ import annotations

import random

import pytest

from reshard.planner.cells import broadcast_runs, cell_tasks, expect_runs
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.decompose import Cell
from reshard.planner.schedule.work import WorkList, _Demand
from reshard.planner.values.resources import NIC_OUT
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import assert_same_loads, expect_cells, load_tables, twin_loads

HOSTS, GPUS = 6, 8


def _run(rng, cluster, n, mixed):
    """``n`` cells, most from one holder to needers on one other host (a few receiver
    sets, so they repeat); ``mixed``: some of every other kind too."""
    devices = list(cluster.devices)
    hosts = cluster.hosts
    sets = []
    for _ in range(4):
        h = rng.randrange(len(hosts))
        sets.append(frozenset(rng.sample(hosts[h], rng.randint(2, len(hosts[h])))))
    run = []
    for k in range(n):
        needers = rng.choice(sets)
        holders = frozenset(rng.sample(devices, 1))
        if mixed and rng.random() < 0.2:
            holders = frozenset(rng.sample(devices, rng.choice([1, 2, 3])))
            needers = frozenset(rng.sample(devices, rng.choice([1, 2, 5, 12])))
        box = ((0, rng.choice([1, 3, 64])), (k, k + rng.choice([1, 2])))
        run.append((Cell(box, holders, needers), k % 3, rng.choice([1, 2]), k % 2))
    return run


def _reference(run, loads, monkeypatch):
    """Each cell by plan_broadcast's general path (relay_chain, then charge)."""
    with monkeypatch.context() as m:
        m.setattr(cell_tasks, "_one_host_chain", lambda *args: None)
        return [cell_tasks.plan_broadcast(c, t, i, loads, s) for c, t, i, s in run]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics"])
@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("crowded", [False, True])
def test_plan_broadcasts_is_the_general_path(seed, variant, mixed, crowded, monkeypatch):
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    a, b = twin_loads(rng, cluster, crowded)
    run = _run(rng, cluster, 60, mixed)
    monkeypatch.setattr(broadcast_runs, "MIN_RUN", 1)
    want = _reference(run, a, monkeypatch)
    got = cell_tasks.plan_broadcasts(run, b)
    assert got == want
    assert_same_loads(a, b, expected_order=False)


@pytest.mark.parametrize("seed", range(4))
def test_a_run_of_one_host_broadcasts_is_planned_by_rounds(seed, monkeypatch):
    """Cells that all go to one other host without relays: plan_run answers (not the
    per-cell loop), with the general path's tasks and loads."""
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    a, b = twin_loads(rng, cluster, False)
    run = []
    for k in range(broadcast_runs.MIN_RUN + 40):
        h = 1 + k % (HOSTS - 1)
        needers = frozenset(cluster.hosts[h][:2 + (k // 7) % 3 * 3]) if h % 2 else \
            frozenset(cluster.hosts[h])
        holder = rng.choice(cluster.hosts[0])
        run.append((Cell(((0, 1 + k % 5), (k, k + 1)), frozenset({holder}), needers),
                    0, 2, 1))
    # receiver sets of one host share its NICs: one set per host for the rounds
    run = [(Cell(c.box, c.holders, frozenset(cluster.hosts[1 + k % (HOSTS - 1)][:6])),
            t, i, s) for k, (c, t, i, s) in enumerate(run)]
    want = _reference(run, a, monkeypatch)
    got = broadcast_runs.plan_run(run, b)
    assert got is not None
    assert got == want
    assert_same_loads(a, b, expected_order=False)


def test_plan_run_declines_receiver_sets_that_share_a_nic():
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    a, _ = twin_loads(random.Random(0), cluster, False)
    hosts = cluster.hosts
    run = [(Cell(((0, 1), (k, k + 1)), frozenset({hosts[0][0]}),
                 frozenset(hosts[1][k % 2:k % 2 + 3])), 0, 2, 0)
           for k in range(broadcast_runs.MIN_RUN)]
    before = load_tables(a)[:4]  # the loads (it may look expectations up: 0.0 each)
    assert broadcast_runs.plan_run(run, a) is None
    assert load_tables(a)[:4] == before


def test_plan_run_declines_a_root_seen_before_sending_into_its_own_host():
    """A root asked once (its NIC out may not relay) is remembered; a later cell of it
    whose receivers are on its own host still declines the run, loads unchanged."""
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    hosts = cluster.hosts
    root = hosts[0][0]

    def run(own_host_at):
        return [(Cell(((0, 1), (k, k + 1)), frozenset({root}),
                      frozenset(hosts[0 if k == own_host_at else 1 + k % 2][1:4])), 0, 2, 0)
                for k in range(broadcast_runs.MIN_RUN)]

    a, b = twin_loads(random.Random(0), cluster, False)
    assert broadcast_runs.plan_run(run(-1), a) is not None  # planned: the root may not relay
    before = load_tables(b)[:4]
    assert broadcast_runs.plan_run(run(5), b) is None
    assert load_tables(b)[:4] == before


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics"])
def test_demand_of_one_holder_is_loads_expect(seed, variant):
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    a, b = twin_loads(rng, cluster, False)
    devices = list(cluster.devices)
    demand = _Demand(b)
    for _ in range(80):
        holders = frozenset(rng.sample(devices, rng.choice([1, 1, 1, 2])))
        needers = frozenset(rng.sample(devices, rng.choice([1, 2, 3, 8, 20])))
        nbytes = rng.choice([1000, 4096, 3 * 7 * 11])
        a.expect(holders, needers - holders, nbytes)
        demand.expect(holders, needers, nbytes)
    assert dict(a.expected) == dict(b.expected)
    assert (a.shared, a._epoch) == (b.shared, b._epoch)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("variant", ["preset", "pieces", "two-nics"])
@pytest.mark.parametrize("mixed", [False, True])
def test_expect_run_is_loads_expect_in_turn(seed, variant, mixed):
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)[variant]
    a, b = twin_loads(rng, cluster, True)
    for loads in (a, b):  # whole expectations from before (fractions: test_fractions)
        for key in list(loads.expected):
            loads.expected[key] = float(round(loads.expected[key]))
    cells, nbytes = expect_cells(rng, cluster, expect_runs.MIN_RUN + 20, mixed=mixed)
    for cell, nb in zip(cells, nbytes):
        a.expect(cell.holders, cell.needers - cell.holders, nb)
    done = expect_runs.expect_run(b, cells, nbytes)
    if not done:  # declined, nothing changed: the caller goes slice by slice
        assert mixed
        demand = _Demand(b)
        for cell, nb in zip(cells, nbytes):
            demand.expect(cell.holders, cell.needers, nb)
    assert dict(a.expected) == dict(b.expected)
    assert (a.shared, a._epoch) == (b.shared, b._epoch)


def test_expect_run_declines_fractions_and_changes_nothing():
    rng = random.Random(1)
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    loads, _ = twin_loads(rng, cluster, True)
    for key in list(loads.expected):
        loads.expected[key] = float(round(loads.expected[key]))
    cells, nbytes = expect_cells(rng, cluster, expect_runs.MIN_RUN)
    cells[7] = Cell(cells[7].box, frozenset({0}), frozenset(cluster.hosts[5][:3]))
    nbytes[7] = 1001  # entering three NICs: fractions of bytes
    before = (dict(loads.expected), loads.shared, loads._epoch)
    assert not expect_runs.expect_run(loads, cells, nbytes)
    assert (dict(loads.expected), loads.shared, loads._epoch) == before
    nbytes[7] = 1002  # whole thirds
    (h,) = cells[0].holders
    loads.expected[(NIC_OUT, loads.nic(h))] = 0.5  # a fraction from before
    before = (dict(loads.expected), loads.shared, loads._epoch)
    assert not expect_runs.expect_run(loads, cells, nbytes)
    assert (dict(loads.expected), loads.shared, loads._epoch) == before
    loads.expected[(NIC_OUT, loads.nic(h))] = 1.0
    assert expect_runs.expect_run(loads, cells, nbytes)


def test_expect_run_of_empty_slices_notes_their_nics():
    """Zero bytes still name the NICs a slice crosses (keys of the expectations)."""
    rng = random.Random(2)
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    a, b = twin_loads(rng, cluster, False)
    cells, _ = expect_cells(rng, cluster, expect_runs.MIN_RUN)
    for cell in cells:
        a.expect(cell.holders, cell.needers - cell.holders, 0)
    assert expect_runs.expect_run(b, cells, [0] * len(cells))
    assert dict(a.expected) == dict(b.expected)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("last", [0, 2])
def test_assemble_of_general_slices_only_is_the_loop(seed, last, monkeypatch):
    """WorkList.assemble where every slice is general and none is fanned out (the
    tasks one after another) against its loop (forced: ``WorkList.fanned`` names a
    slice; with every slice at step 0 or its tensor's last step the loop splits
    nothing)."""
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    devices = list(cluster.devices)
    orders = []
    for force in (False, True):
        work = WorkList(cluster, Loads(cluster))
        r = random.Random(seed)
        for tensor in range(2):
            cells = [Cell(((0, 2), (k, k + 1 + r.randrange(3))),
                          frozenset(r.sample(devices, r.choice([1, 2]))),
                          frozenset(r.sample(devices, r.choice([2, 5, 9]))))
                     for k in range(30)]
            work.add_cells(tensor, cells, 2, [r.choice([0, last]) for _ in cells], None)
        if force:
            monkeypatch.setattr(WorkList, "fanned", lambda self, planned=None: [[]])
        ordered = work.plan(cell_tasks.plan_broadcast, [2, 2], expect=True, relays=True,
                            fan_out=True)
        orders.append((ordered.tasks(), ordered.positions))
    assert orders[0] == orders[1]
    assert len(orders[0][0]) >= 60

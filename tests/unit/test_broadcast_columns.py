"""Broadcasts kept as columns in the ordered plan (planner/schedule/broadcast_columns.py,
KeptRows.keyed_plan, WorkList._ordered's kept part, OrderedTasks' kept part, and
costing.columns / chain_columns.kept_routes pricing them) against the paths they
replace: the same tasks in the same order as the cells planned one by one, and the
same seconds as the plan of every task built (its chains laid out from the tasks, or
priced by task_routes)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.builds import Builds
from reshard.planner.cells import broadcast_rows, broadcast_runs, decompose, expect_runs, reduce
from reshard.planner.costing import chain_columns, columns
from reshard.planner.costing.columns import estimate_columns
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import make_tensor_spec
from reshard.planner.schedule import work
from reshard.planner.schedule.broadcast_columns import BroadcastColumns
from reshard.planner.schedule.send_columns import OrderedTasks
from reshard.planner.values.strategy import Strategy

PAIRS = [("RR+P0", "RS0"), ("RR+P01", "RS0"), ("RS1+P0", "S0S1"), ("S0R+P1", "RS0")]
CLUSTERS = {
    "preset": lambda n: Cluster.preset("dgx-h100", n),
    "pieces": lambda n: Cluster.regular(n // 8, 8, relay_piece=1 << 12),
    "one-nic": lambda n: Cluster.regular(n // 8, 8, nics_per_host=1),
}


def _small_runs(m):
    """Let 4x8 and 8x8 partial sums keep their reduced pieces as rows (the runs' least
    lengths and the numpy grid's threshold lowered)."""
    m.setattr(decompose, "CELLS_FROM", 4)
    m.setattr(broadcast_runs, "MIN_RUN", 8)
    m.setattr(broadcast_rows, "MIN_RUN", 8)
    m.setattr(expect_runs, "MIN_RUN", 8)
    m.setattr(work, "EXPECT_RUN", 8)


def _ordered(pair, hosts, shape, cluster):
    n = hosts * 8
    a, b = DeviceMesh((hosts, 8), range(n)), DeviceMesh((hosts, 8), range(n, 2 * n))
    tensors = (make_tensor_spec(shape, "bfloat16", Layout(a, pair[0]), Layout(b, pair[1]),
                                cluster),)
    got = Builds().columns(tensors, cluster, Strategy.BROADCAST, False)
    assert got is not None
    return got[0], tensors


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("name", sorted(CLUSTERS))
@pytest.mark.parametrize("hosts, shape", [(4, (4096, 1024)), (8, (2048, 512))])
def test_kept_columns_are_the_cells_tasks_and_price_as_them(pair, name, hosts, shape,
                                                            monkeypatch):
    cluster = CLUSTERS[name](2 * hosts * 8)
    with monkeypatch.context() as m:
        _small_runs(m)
        ordered, tensors = _ordered(pair, hosts, shape, cluster)
        m.setattr(reduce, "_one_holder_broadcasts", lambda table: False)
        cells, _ = _ordered(pair, hosts, shape, cluster)  # no row kept: cell by cell
    assert cells.kept is None
    if pair[0] in ("RR+P0", "RR+P01") and name == "preset" and hosts == 4:
        assert ordered.kept is not None and len(ordered.kept)  # kept to the plan
    monkeypatch.setattr(chain_columns, "CHAINS_FROM", 16)  # the kept laid out as arrays
    want = estimate_columns(cells, tensors, cluster)
    assert want == ReshardPlan(tensors, cells.tasks(), Strategy.BROADCAST, cluster).estimate()
    got = estimate_columns(ordered, tensors, cluster)  # before a task is built
    assert got == want
    assert ordered.tasks() == cells.tasks()
    assert ordered.positions == cells.positions and ordered.objects == cells.objects
    assert len(ordered) == len(cells)
    assert estimate_columns(ordered, tensors, cluster) == want


@pytest.mark.parametrize("chains_from", [1, 100, 10 ** 6])
@pytest.mark.parametrize("pair", PAIRS[:2])
def test_kept_columns_price_as_the_tasks_whichever_way_the_chains_go(chains_from, pair,
                                                                     monkeypatch):
    """However many chains of a length are laid out as arrays (CHAINS_FROM): the kept
    columns laid out, or declined and built as tasks, give the same seconds as the
    plan of every task built."""
    cluster = CLUSTERS["preset"](64)
    with monkeypatch.context() as m:
        _small_runs(m)
        ordered, tensors = _ordered(pair, 4, (4096, 1024), cluster)
    assert ordered.kept is not None
    monkeypatch.setattr(chain_columns, "CHAINS_FROM", chains_from)
    laid = []
    real = columns.kept_routes

    def spy(*args):
        got = real(*args)
        laid.append(got is not None)
        return got

    monkeypatch.setattr(columns, "kept_routes", spy)
    got = estimate_columns(ordered, tensors, cluster)
    assert laid == [chains_from <= len(ordered.kept)]
    built = OrderedTasks(ordered.objects, ordered.positions, ordered.send_columns)
    assert got == estimate_columns(built, tensors, cluster)
    assert got == ReshardPlan(tensors, ordered.tasks(), Strategy.BROADCAST,
                              cluster).estimate()


def test_taken_columns_build_the_same_task_objects(monkeypatch):
    cluster = CLUSTERS["preset"](64)
    with monkeypatch.context() as m:
        _small_runs(m)
        ordered, _ = _ordered(PAIRS[0], 4, (4096, 1024), cluster)
    kept = ordered.kept
    assert kept is not None and kept._taken is not None
    whole, order = kept._taken
    alone = [kept.task(i) for i in range(len(kept))]  # each built alone, none kept
    assert not kept._built and not whole._built
    tasks = kept.tasks()
    assert [t for (t,) in tasks] == alone
    assert all(t is whole.tasks()[i][0] for (t,), i in zip(tasks, order.tolist()))
    assert kept.tasks() is tasks  # built once
    assert kept.task(3) is tasks[3][0]
    rng = random.Random(0)
    pick = np.array(rng.sample(range(len(kept)), 40), dtype=np.int64)
    assert [t for (t,) in kept.take(pick).tasks()] == [tasks[i][0] for i in pick.tolist()]
    rows = kept.devices()
    assert rows is not None
    assert rows.tolist() == [[t.root, *t.receivers] for (t,) in tasks]


def test_devices_are_none_for_chains_of_two_lengths(monkeypatch):
    cluster = CLUSTERS["preset"](64)
    with monkeypatch.context() as m:
        _small_runs(m)
        ordered, _ = _ordered(PAIRS[0], 4, (4096, 1024), cluster)
    kept = ordered.kept
    assert kept is not None
    short = BroadcastColumns(kept.tensor, kept.table, kept.row, kept.root, kept.chain,
                             [c[:-1] if k == 0 else c for k, c in enumerate(kept.chains)],
                             kept.nbytes, kept.step)
    assert len({len(c) for c in short.chains}) == 2
    assert short.devices() is None


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("name", ["preset", "pieces"])
def test_the_arrays_in_place_price_as_those_laid_out(pair, name, monkeypatch):
    """A plan of no send whose tasks are in place (the first tasks, then the kept
    broadcasts) is priced from its arrays as they are: the same seconds as laying
    them out place by place."""
    cluster = CLUSTERS[name](64)
    with monkeypatch.context() as m:
        _small_runs(m)
        ordered, tensors = _ordered(pair, 4, (4096, 1024), cluster)
    got = estimate_columns(ordered, tensors, cluster)
    seen = []
    real = columns._in_order

    def laid_out(at, n):
        seen.append(real(at, n))
        return False

    monkeypatch.setattr(columns, "_in_order", laid_out)
    assert estimate_columns(ordered, tensors, cluster) == got
    assert len(seen) == 2
    if ordered.kept is not None and not len(ordered.send_columns.position):
        assert all(seen)


def test_in_order_is_every_place_in_order():
    assert columns._in_order(np.arange(5), 5)
    assert columns._in_order(np.zeros(0, dtype=np.int64), 0)
    assert not columns._in_order(np.arange(4), 5)
    assert not columns._in_order(np.array([0, 2, 1, 3, 4]), 5)


@pytest.mark.parametrize("seed", range(3))
def test_kept_columns_among_the_objects_take_their_places(seed, monkeypatch):
    """The kept broadcasts at places before and among the other objects (not after
    them all): every task at its place, and the same seconds as the tasks built."""
    cluster = CLUSTERS["preset"](64)
    with monkeypatch.context() as m:
        _small_runs(m)
        ordered, tensors = _ordered(PAIRS[seed % 2], 4, (4096, 1024), cluster)
    kept = ordered.kept
    assert kept is not None and not len(ordered.send_columns.position)
    own, n = ordered.own_objects, len(ordered)
    rng = random.Random(seed)
    own_at = sorted(rng.sample(range(n), len(own)))
    kept_at = np.array(sorted(set(range(n)) - set(own_at)), dtype=np.int64)
    moved = OrderedTasks(own, own_at, ordered.send_columns, kept, kept_at)
    want = [None] * n
    for i, t in zip(own_at, own):
        want[i] = t
    for i, (t,) in zip(kept_at.tolist(), kept.tasks()):
        want[i] = t
    assert list(moved.tasks()) == want and moved.objects == want
    assert moved.positions == list(range(n))
    fresh = OrderedTasks(own, own_at, ordered.send_columns, kept, kept_at)
    got = estimate_columns(fresh, tensors, cluster)  # priced from the columns
    assert got == estimate_columns(OrderedTasks(want, list(range(n)), ordered.send_columns),
                                   tensors, cluster)


@pytest.mark.parametrize("seed", range(3))
def test_kept_columns_of_several_latencies_price_as_their_tasks(seed, monkeypatch):
    """Kept broadcasts of several sizes on a cluster that pipelines relay pieces (so of
    several latencies), among the other tasks: the same seconds as the tasks built."""
    with monkeypatch.context() as m:
        _small_runs(m)
        ordered, tensors = _ordered(PAIRS[seed % 2], 4, (4096, 1024), CLUSTERS["preset"](64))
    kept = ordered.kept
    assert kept is not None
    rng = np.random.default_rng(seed)
    sized = BroadcastColumns(kept.tensor, kept.table, kept.row, kept.root, kept.chain,
                             kept.chains, rng.choice([8, 1 << 12, 3 << 14, 1 << 20], len(kept)),
                             kept.step)
    priced = OrderedTasks(ordered.own_objects, ordered.own_positions, ordered.send_columns,
                          sized, ordered.kept_positions)
    cluster = CLUSTERS["pieces"](64)
    monkeypatch.setattr(chain_columns, "CHAINS_FROM", 16)
    got = columns._kept(priced, cluster, *columns.shared_hops(columns.Routes(),
                                                              cluster).arrays(cluster))
    assert got is not None and len(set(got.lat.tolist())) > 1
    want = estimate_columns(OrderedTasks(priced.objects, priced.positions,
                                         ordered.send_columns), tensors, cluster)
    assert estimate_columns(priced, tensors, cluster) == want
    assert want == ReshardPlan(tensors, priced.tasks(), Strategy.BROADCAST, cluster).estimate()

"""Reductions laid out as chains (issue 62, round twelve): a run of reductions' codes
and latencies (short chains by pattern, long ones summed as arrays) are what
:func:`~reshard.planner.costing.cost.task_routes` gives each, the rows' checks and
codes are those of a brute-force oracle whatever test a width takes, and a one-step
plan's columns are priced by the one-step rule with the whole plan's seconds."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.builds import Builds
from reshard.planner.costing import chain_columns, chain_reach, chain_rows, columns
from reshard.planner.costing.chain_columns import chain_routes
from reshard.planner.costing.columns import estimate_columns
from reshard.planner.costing.cost import ARRAY_EDGES, Hops, task_routes
from reshard.planner.costing.fairshare import path_arrays
from reshard.planner.costing.stepgate import OneStep, StepGate
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import make_tensor_spec
from reshard.planner.values.resources import DEV_IN, DEV_OUT, KIND_CODE, NIC_IN, NIC_OUT
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit._chain_clusters import BOX, CLUSTERS

SIZES = (8, 4096, 8192, 1 << 20, 3 << 21)


def _reductions(rng: random.Random, count: int, ndev: int, width: int) -> list[Task]:
    """Reductions of ``width`` addends into a root (some flawed: the root among its
    addends, an addend twice, one off the cluster), and broadcasts among them."""
    tasks = []
    for _ in range(count):
        devs = rng.sample(range(ndev), width + 1)
        pick = rng.random()
        if pick < 0.05:
            devs[1] = devs[0]  # the root among the addends
        elif pick < 0.1:
            devs[2] = devs[3]  # an addend twice
        elif pick < 0.13:
            devs[-1] = ndev + 3  # off the cluster
        kind = TaskKind.BROADCAST if pick > 0.85 else TaskKind.REDUCE
        tasks.append(Task(kind, 0, BOX, devs[0], tuple(devs[1:]), rng.choice(SIZES)))
    return tasks


@pytest.mark.parametrize("width", [3, 7, ARRAY_EDGES - 1, ARRAY_EDGES, 100])
@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_reduction_runs_are_task_routes(name, width, monkeypatch):
    cluster = CLUSTERS[name]
    ndev = len(cluster.devices)
    monkeypatch.setattr(chain_columns, "CHAINS_FROM", 4)
    monkeypatch.setattr(chain_reach, "ROWS_AT_ONCE", 7)  # several blocks of rows
    tasks = _reductions(random.Random(width + len(name)), 120, ndev, width)
    got = chain_routes(tasks, cluster, *Hops().arrays(cluster))
    assert got is not None
    index = got.index.tolist()
    laid = {i for i, t in enumerate(tasks) if len(set(t.devices)) == len(t.devices)
            and max(t.devices) < ndev}
    assert set(index) == laid
    assert {tasks[i].kind for i in index} == {TaskKind.REDUCE, TaskKind.BROADCAST}
    want = task_routes([tasks[i] for i in index], cluster)
    starts = np.cumsum(got.lens) - got.lens
    members = np.cumsum(got.need) - got.need
    for j, (path, lat) in enumerate(want):
        codes, frac = path_arrays(path)
        assert got.codes[starts[j]:starts[j] + got.lens[j]].tolist() == codes.tolist()
        assert (frac == 1.0).all()
        assert got.lat[j] == lat  # the float itself
        t = tasks[index[j]]
        assert sorted(got.members[members[j]:members[j] + got.need[j]].tolist()) == \
            sorted(t.devices)
    assert len(set(got.lat.tolist())) > 1


def _flawed_rows(rng: random.Random, n: int, width: int, ndev: int) -> np.ndarray:
    rows = np.array([rng.sample(range(ndev), width) for _ in range(n)], dtype=np.int64)
    for r in rng.sample(range(n), n // 5):
        i, j = rng.sample(range(width), 2)
        rows[r, i] = rows[r, j]  # a device twice
    return rows


def _distinct_oracle(rows: np.ndarray) -> list[bool]:
    return [len(set(r)) == len(r) for r in rows.tolist()]


@pytest.mark.parametrize("width", [2, 5, chain_rows.PAIRWISE_UP_TO,
                                   chain_rows.PAIRWISE_UP_TO + 1, 60])
@pytest.mark.parametrize("table", [True, False])
def test_distinct_rows_is_the_set_test(width, table, monkeypatch):
    """Column pairs, a table of flags or a sort: each row's devices distinct or not,
    as a set says."""
    if not table:
        monkeypatch.setattr(chain_rows, "TABLE_UP_TO", 0)
    rows = _flawed_rows(random.Random(width), 200, width, 128)
    got = chain_rows.distinct_rows(rows, 128).tolist()
    assert got == _distinct_oracle(rows)
    assert True in got and False in got


@pytest.mark.parametrize("width", [4, 30])
def test_priced_rows_are_on_the_cluster_and_distinct(width):
    cluster = CLUSTERS["odd hosts"]
    host, _ = Hops().arrays(cluster)
    rows = _flawed_rows(random.Random(width), 300, width, 128)
    assert chain_rows.priced(rows, host).tolist() == _distinct_oracle(rows)  # all on
    hole = host.copy()
    hole[40] = -1  # a device in the table with no host
    for off in (False, True):  # every row in the table; some out of it as well
        if off:
            rows[7, 1], rows[9, 0], rows[11, 2] = 200, -1, len(host)
        want = [ok and all(0 <= d < len(host) and d != 40 for d in r)
                for ok, r in zip(_distinct_oracle(rows), rows.tolist())]
        assert chain_rows.priced(rows, hole).tolist() == want
        assert want.count(True) < _distinct_oracle(rows).count(True) - 3 * off


def _hop_codes(a: int, b: int, cluster: Cluster) -> list[int]:
    """One edge's codes, read from the cluster's maps (the oracle)."""
    out = [a * 8 + KIND_CODE[DEV_OUT], b * 8 + KIND_CODE[DEV_IN]]
    if cluster.host_map[a] != cluster.host_map[b]:
        out += [cluster.nic_map[a] * 8 + KIND_CODE[NIC_OUT],
                cluster.nic_map[b] * 8 + KIND_CODE[NIC_IN]]
    return out


@pytest.mark.parametrize("width", [2, 9, 64])
@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_chain_codes_are_each_edges_hop(name, width):
    cluster = CLUSTERS[name]
    rng = random.Random(width)
    rows = np.array([rng.sample(range(len(cluster.devices)), width) for _ in range(150)],
                    dtype=np.int64)
    rows[:20] = np.arange(width)  # edges within a host too
    lens, codes, cross = chain_rows.codes(rows, *Hops().arrays(cluster))
    want = [[c for a, b in itertools.pairwise(r) for c in _hop_codes(a, b, cluster)]
            for r in rows.tolist()]
    assert lens.tolist() == [len(w) for w in want]
    assert codes.tolist() == [c for w in want for c in w]
    assert cross.tolist() == [[cluster.host_map[a] != cluster.host_map[b]
                               for a, b in itertools.pairwise(r)] for r in rows.tolist()]
    assert cross.any() and not cross.all()


@pytest.mark.parametrize("src,dst", [("RR+P01", "RS0"), ("S0R+P1", "RS0"), ("RR+P0", "RS0"),
                                     ("RS1+P0", "S0S1")])
@pytest.mark.parametrize("name", ["regular", "pieces"])
def test_plans_with_reduction_runs_price_the_whole_plan(src, dst, name, monkeypatch):
    """Partial sources at 4x8: with every run laid out (reductions among them), the
    columns' seconds are the whole plan's."""
    cluster = Cluster.preset("dgx-h100", 8) if name == "regular" else \
        Cluster.regular(8, 8, relay_piece=1 << 14)
    a = Layout(DeviceMesh((4, 8), range(32)), src)
    b = Layout(DeviceMesh((4, 8), range(32, 64)), dst)
    tensors = (make_tensor_spec((2048, 512), "bfloat16", a, b, cluster),)
    ordered, _ = Builds().columns(tensors, cluster, Strategy.BROADCAST, False)
    want = ReshardPlan(tensors, ordered.tasks(), Strategy.BROADCAST, cluster).estimate()
    monkeypatch.setattr(chain_columns, "CHAINS_FROM", 1)
    seen = []
    real = columns.chain_routes

    def spy(objects, *args, **kw):
        got = real(objects, *args, **kw)
        seen.append({objects[i].kind for i in ([] if got is None else got.index.tolist())})
        return got

    monkeypatch.setattr(columns, "chain_routes", spy)
    assert estimate_columns(ordered, tensors, cluster) == want
    assert TaskKind.REDUCE in seen[0]


def test_one_step_columns_gate_as_the_full_rule(monkeypatch):
    """A plan whose every task is in one step is gated by the one-step rule (no
    memberships), with the seconds of the full rule; a plan of two steps is not."""
    cluster = Cluster.preset("dgx-h100", 8)
    a = Layout(DeviceMesh((4, 8), range(32)), "S0R")
    b = Layout(DeviceMesh((4, 8), range(32, 64)), "RS1")
    tensors = (make_tensor_spec((2048, 512), "bfloat16", a, b, cluster),)
    ordered, _ = Builds().columns(tensors, cluster, Strategy.SEND_RECV, False)
    assert len({t.step for t in ordered.tasks()}) == 1
    gates = []
    real = columns._gate

    def spy(*args):
        got = real(*args)
        gates.append(got)
        return got

    monkeypatch.setattr(columns, "_gate", spy)
    one = estimate_columns(ordered, tensors, cluster)
    assert isinstance(gates[-1], OneStep)
    monkeypatch.setattr(columns, "_one_step", lambda *args: False)
    full = estimate_columns(ordered, tensors, cluster)
    assert isinstance(gates[-1], StepGate)
    assert one == full == ReshardPlan(tensors, ordered.tasks(), Strategy.SEND_RECV,
                                      cluster).estimate()
    two = (make_tensor_spec((2048, 512), "bfloat16", Layout(a.mesh, "RR+P01"), b, cluster),)
    ordered, _ = Builds().columns(two, cluster, Strategy.BROADCAST, False)
    assert len({t.step for t in ordered.tasks()}) > 1
    monkeypatch.undo()
    monkeypatch.setattr(columns, "_gate", spy)
    estimate_columns(ordered, two, cluster)
    assert isinstance(gates[-1], StepGate)

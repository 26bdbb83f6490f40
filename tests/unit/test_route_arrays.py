"""Large routes, trees and baseline floors read as arrays (issue 62, 1,024 devices):
each array form gives exactly what its one-by-one form gives (the same codes, the same
floats), on the tasks and cells of real plans and on random trees."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.cells import balance, chain_cuts, trees
from reshard.planner.cells.trees import SHAPES, Intra, treeify
from reshard.planner.costing import cost
from reshard.planner.costing.cost import Hops, one_at_a_time_time, task_path
from reshard.planner.costing.fairshare import Path, path_arrays
from reshard.planner.estimates import CostCache, estimate_many
from reshard.planner.plan import make_tensor_spec, plan_tasks
from reshard.planner.schedule import floors
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task
from tests.unit._reach_loop import reach_loop

CLUSTER = Cluster.preset("dgx-h100", 16)  # 16 hosts x 8
SRC = Layout(DeviceMesh((8, 8), range(64)), "S10R")
DST = Layout(DeviceMesh((8, 8), range(64, 128)), "RR")


def _chains() -> tuple[Task, ...]:
    tensors = (make_tensor_spec((4096, 1024), "bfloat16", SRC, DST, CLUSTER),)
    tasks, _ = plan_tasks(tensors, CLUSTER, Strategy.BROADCAST, fan_out=False)
    return tasks


def _one_by_one(task: Task, cluster: Cluster) -> tuple[list, float]:
    """A task's route through the loop of a few edges, whatever its size."""
    old = cost.ARRAY_EDGES
    cost.ARRAY_EDGES = 1 << 30
    try:
        path, lat = task_path(task, cluster)
    finally:
        cost.ARRAY_EDGES = old
    return list(path), lat


def _tasks() -> list[Task]:
    chains = _chains()
    out = list(chains)
    for shape in SHAPES:
        for intra in Intra:
            out += treeify(chains, CLUSTER.host_of, intra, shape)
    return out


@pytest.mark.parametrize("relay_piece", [0, 1 << 20])
def test_a_large_route_as_arrays_is_the_one_by_one_route(relay_piece):
    cluster = dataclasses.replace(CLUSTER, relay_piece=relay_piece)
    tasks = _tasks()
    assert max(len(t.receivers) for t in tasks) >= cost.ARRAY_EDGES
    for t in tasks[::7]:
        path, lat = task_path(t, cluster)
        assert isinstance(path, Path)
        want_path, want_lat = _one_by_one(t, cluster)
        assert lat == want_lat  # the same float, not a close one
        assert list(path) == want_path
        assert len(path) == len(want_path)


def test_a_path_made_from_codes_reads_as_its_list():
    codes = np.array([3 * 8 + 2, 9 * 8 + 3, 1 * 8 + 0], dtype=np.int64)
    path = Path.of_codes(codes)
    assert len(path) == 3
    assert path[0] == (("dev_out", 3), 1.0)
    assert list(path) == [(("dev_out", 3), 1.0), (("dev_in", 9), 1.0), (("nic_out", 1), 1.0)]
    assert path_arrays(path)[0] is codes




@pytest.mark.parametrize("seed", range(6))
def test_the_reach_of_a_random_tree_is_the_loop_s(seed):
    rng = random.Random(seed)
    n = rng.choice([70, 300, 1200]) if seed % 3 == 0 else 1200
    devices = rng.sample(range(4 * n), n + 1)
    root, rest = devices[0], devices[1:]
    a, b = [], []
    reached = [root]
    deep = seed % 3 == 0
    for d in rest:  # each device fed by one reached before it (a chain's: deep)
        a.append(reached[-1] if deep and rng.random() < 0.9 else rng.choice(reached))
        b.append(d)
        reached.append(d)
    if seed % 2:  # a device reached twice, and one sending before it is reached
        a.append(rest[-1])
        b.append(rest[3])
        a[5], a[6] = rest[40], rest[41]
    wait = [rng.choice([2e-6, 3.3e-6, 1.1e-5]) for _ in a]
    fill = [rng.random() * 1e-4 for _ in a]
    arrays = [np.array(x) for x in (a, b, wait, fill)]
    got = cost._reach(*arrays)
    assert got == reach_loop(a, b, wait, fill)
    by_depth = cost._reach_by_depth(*arrays, 4 * n + 1)
    assert (by_depth is None) == (deep or seed % 2 == 1)  # shallow and once each: by depth
    assert by_depth is None or by_depth == got


def test_tree_edges_as_arrays_are_the_one_by_one_edges():
    order = list(range(1, 40))
    entry = {h: 8 * h for h in order}
    members = {h: [8 * h + i for i in range(1, 1 + h % 8)] for h in order}
    for intra in Intra:
        for parent in (trees._heap_parent, trees._previous, trees._first):
            groups = [members[h] for h in order]
            want = trees._few_edges(order, 3, entry, groups, intra, parent)
            assert sum(map(len, groups)) >= trees.ARRAY_MEMBERS
            assert trees._tree_edges(order, 3, entry, members, intra, parent) == want


@pytest.mark.parametrize("src,dst", [("S10R", "RR"), ("S0R+P1", "RS0"), ("S0R", "RS1")])
def test_a_large_cell_s_floor_as_arrays_is_the_one_by_one_floor(src, dst, monkeypatch):
    """Every baseline floor and estimate of a 16-host request, its cells counted as
    arrays or one by one: the same floats."""
    a = Layout(DeviceMesh((16, 8), range(128)), src)
    b = Layout(DeviceMesh((16, 8), range(128, 256)), dst)
    cluster = Cluster.preset("dgx-h100", 32)
    seen: list[float] = []
    real = floors.baseline_floor

    def record(*args):
        seen.append(real(*args))
        return seen[-1]

    import reshard.planner.builds as builds_module
    monkeypatch.setattr(builds_module, "baseline_floor", record)
    req = ((4096, 512), "bfloat16", a, b, cluster)
    arrays = estimate_many([req], cache=CostCache())
    by_arrays, seen[:] = list(seen), []
    monkeypatch.setattr(floors, "ARRAY_RECEIVERS", 1 << 30)
    monkeypatch.setattr(cost, "ARRAY_EDGES", 1 << 30)
    monkeypatch.setattr(trees, "ARRAY_MEMBERS", 1 << 30)
    monkeypatch.setattr(balance, "ARRAY_CHAIN", 1 << 30)
    monkeypatch.setattr(cost.Hops, "host_step", lambda self, cluster: None)
    assert estimate_many([req], cache=CostCache()) == arrays
    assert seen == by_arrays


def test_one_at_a_time_reads_large_paths_as_arrays():
    from reshard.planner.plan import plan

    p = plan((4096, 1024), "bfloat16", SRC, DST, CLUSTER)
    got = one_at_a_time_time(p)
    # the same sum by hand: per device, its tasks' latency plus bytes over their
    # slowest resource, in task order
    caps = {"nic_out": CLUSTER.nic_capacity, "nic_in": CLUSTER.nic_capacity,
            "dev_out": CLUSTER.intra_bandwidth, "dev_in": CLUSTER.intra_bandwidth,
            "copy": CLUSTER.copy_bandwidth}
    busy: dict[int, float] = {}
    for t in p.tasks:
        path, lat = task_path(t, CLUSTER, Hops())
        slow = max((f / caps[r[0]] for r, f in path if f > 0), default=0.0)
        for d in set(t.devices):
            busy[d] = busy.get(d, 0.0) + (lat + slow * t.nbytes)
    assert got == max(busy.values())


@pytest.mark.parametrize("seed", range(5))
def test_a_long_chain_s_order_by_arrays_is_the_one_by_one_order(seed, monkeypatch):
    rng = random.Random(seed)
    cluster = Cluster.preset("dgx-h100", 24)
    loads = balance.Loads(cluster)
    for n in range(24 * 8):  # loads with ties (a few values) and zeros
        loads.nic_out[n] = float(rng.choice([0, 0, 1, 2, 5]) << 20)
        loads.nic_in[n] = float(rng.choice([0, 1, 3]) << 20)
    root = rng.randrange(24 * 8)
    receivers = rng.sample(range(24 * 8), rng.choice([66, 100, 180]))
    receivers = [r for r in receivers if r != root]
    if seed == 4:  # the root's host alone
        receivers = [r for r in range(8) if r != root] + list(range(8, 8 + 60))
    got = loads.chain(root, receivers)
    monkeypatch.setattr(balance, "ARRAY_CHAIN", 1 << 30)
    assert got == loads.chain(root, receivers)
    assert sorted(got) == sorted(receivers)


@pytest.mark.parametrize("src,dst", [("S0R+P1", "RS0")])
def test_a_route_moved_by_whole_hosts_is_the_route_found_there(src, dst):
    """On a regular cluster a small task's route is its twin's in host 0, moved: the
    same resources, in the same order, and the same latency as found directly."""
    a = Layout(DeviceMesh((8, 8), range(64)), src)
    b = Layout(DeviceMesh((8, 8), range(64, 128)), dst)
    tensors = (make_tensor_spec((2048, 512), "bfloat16", a, b, CLUSTER),)
    tasks, _ = plan_tasks(tensors, CLUSTER, Strategy.BROADCAST, fan_out=False)
    assert Hops().host_step(CLUSTER) == (8, 8)
    known: cost.Routes = {}
    routes = cost.task_routes(tasks, CLUSTER, known)
    moved = sum(1 for p, _ in routes if p.arrays is not None and p.codes is None)
    assert moved > 0  # some routes came from a twin
    for t, (path, lat) in zip(tasks, routes):
        want, want_lat = task_path(t, CLUSTER)
        assert lat == want_lat
        assert list(path) == list(want)
        assert path_arrays(path)[0].tolist() == path_arrays(Path(want))[0].tolist()


def test_an_irregular_cluster_moves_no_route():
    small = Cluster.preset("dgx-h100", cost.SHIFT_HOSTS - 1)
    assert Hops().host_step(small) is None
    shared = dataclasses.replace(CLUSTER, shared_bandwidth=1e10)
    assert Hops().host_step(shared) is None


def test_a_long_chain_s_host_segments_as_arrays_are_the_loop_s(monkeypatch):
    for t in _chains():
        got = chain_cuts.segments(t, CLUSTER.host_of)
        assert len(t.receivers) >= chain_cuts.ARRAY_DEVICES
        monkeypatch.setattr(chain_cuts, "ARRAY_DEVICES", 1 << 30)
        assert got == chain_cuts.segments(t, CLUSTER.host_of)
        assert all(type(d) is int for seg in got for d in seg)
        monkeypatch.undo()


@pytest.mark.parametrize("seed", range(4))
def test_a_many_needer_slice_s_expectation_by_arrays_is_the_loop_s(seed, monkeypatch):
    rng = random.Random(seed)
    cluster = Cluster.preset("dgx-h100", 24)
    slices = []
    for _ in range(20):
        holders = frozenset(rng.sample(range(192), rng.choice([1, 2, 9])))
        needers = frozenset(rng.sample(range(192), rng.choice([70, 150, 192])))
        slices.append((holders, needers, rng.choice([3, 1 << 20, 12345677])))
    loads = balance.Loads(cluster)
    for s in slices:
        loads.expect(*s)
    monkeypatch.setattr(balance, "ARRAY_CHAIN", 1 << 30)
    by_loop = balance.Loads(cluster)
    for s in slices:
        by_loop.expect(*s)
    assert {k: v for k, v in loads.expected.items() if v} == \
        {k: v for k, v in by_loop.expected.items() if v}


def _edges_loop(order, exit_dev, entry, groups, intra, parent):
    """One edge at a time, as _few_edges once walked them (the reference)."""
    senders, receivers = [], []
    for i, (h, group) in enumerate(zip(order, groups)):
        up = parent(i)
        senders.append(exit_dev if up < 0 else entry[order[up]])
        receivers.append(entry[h])
        prev = entry[h]
        for m in group:
            senders.append(entry[h] if intra is Intra.STAR else prev)
            receivers.append(m)
            prev = m
    return senders, receivers


@pytest.mark.parametrize("seed", range(6))
def test_few_edges_by_whole_groups_are_the_edge_by_edge_edges(seed):
    rng = np.random.default_rng(seed)
    order = [int(h) for h in rng.permutation(12)[: 1 + seed * 2]]
    entry = {h: 100 * h for h in order}
    groups = [[100 * h + i for i in range(1, 1 + int(rng.integers(0, 5)))] for h in order]
    for intra in Intra:
        for parent in (trees._heap_parent, trees._previous, trees._first):
            want = _edges_loop(order, 7, entry, groups, intra, parent)
            assert trees._few_edges(order, 7, entry, groups, intra, parent) == want

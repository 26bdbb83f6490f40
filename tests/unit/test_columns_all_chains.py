"""Plans whose every task (other than sends and kept broadcasts) is a chain (issue 62,
round thirteen): :mod:`~reshard.planner.costing.columns` takes the chains' arrays as
they are (their routes, their fractions left as ones not yet laid out, their devices),
and those are what the task-by-task path gives: each route's codes and latency, each
fraction 1.0, each task's devices as a set; and the plan's seconds are the whole
plan's."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.builds import Builds
from reshard.planner.cells import reduce
from reshard.planner.costing import chain_columns, columns
from reshard.planner.costing.chain_columns import chain_routes
from reshard.planner.costing.columns import estimate_columns
from reshard.planner.costing.cost import ARRAY_EDGES, Hops
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import make_tensor_spec
from reshard.planner.schedule.send_columns import OrderedTasks
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit._chain_clusters import BOX, CLUSTERS

SIZES = (8, 4096, 1 << 20, 3 << 21)


def _chains(rng: random.Random, count: int, ndev: int, widths: tuple[int, ...],
            flawed: bool) -> list[Task]:
    """Reductions and broadcasts of the given receiver counts over distinct devices
    (``flawed``: some with a device twice, the root among the others: not chains)."""
    tasks = []
    for _ in range(count):
        devs = rng.sample(range(ndev), rng.choice(widths) + 1)
        pick = rng.random()
        if flawed and pick < 0.15:
            devs[1] = devs[0]
        kind = TaskKind.BROADCAST if pick > 0.6 else TaskKind.REDUCE
        tasks.append(Task(kind, 0, BOX, devs[0], tuple(devs[1:]), rng.choice(SIZES)))
    return tasks


def _laid_out(tasks, cluster, monkeypatch):
    monkeypatch.setattr(chain_columns, "CHAINS_FROM", 2)
    return chain_routes(tasks, cluster, *Hops().arrays(cluster))


@pytest.mark.parametrize("widths", [(3,), (2, 9), (ARRAY_EDGES - 1, ARRAY_EDGES + 3)])
@pytest.mark.parametrize("flawed", [False, True])
@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_routes_of_chains_are_the_task_routes(name, flawed, widths, monkeypatch):
    cluster = CLUSTERS[name]
    tasks = _chains(random.Random(len(name) + 7 * len(widths)), 60,
                    len(cluster.devices), widths, flawed)
    chains = _laid_out(tasks, cluster, monkeypatch)
    assert chains is not None
    assert (len(chains.index) == len(tasks)) is not flawed  # flawed: some not chains
    lens, codes, frac, lat = columns._routes(tasks, chains, cluster, None, ())
    want_lens, want_codes, want_frac, want_lat = columns._routes(tasks, None, cluster, None,
                                                                 ())
    assert lens.tolist() == want_lens.tolist()
    assert codes.tolist() == want_codes.tolist()
    assert lat.tolist() == want_lat.tolist()  # the floats themselves
    assert (frac is None) is not flawed
    got_frac = columns._fractions(frac, len(codes))
    assert len(got_frac) == len(want_frac)
    assert got_frac.tolist() == want_frac.tolist()


@pytest.mark.parametrize("flawed", [False, True])
@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_devices_of_chains_are_each_tasks_set(name, flawed, monkeypatch):
    cluster = CLUSTERS[name]
    tasks = _chains(random.Random(len(name)), 50, len(cluster.devices), (2, 5, 30), flawed)
    chains = _laid_out(tasks, cluster, monkeypatch)
    need, members = columns._devices(tasks, chains)
    want_need, want_members = columns._devices(tasks, None)
    assert need.tolist() == want_need.tolist()
    at, want_at = np.cumsum(need) - need, np.cumsum(want_need) - want_need
    for i in range(len(tasks)):
        assert sorted(members[at[i]:at[i] + need[i]].tolist()) == \
            sorted(want_members[want_at[i]:want_at[i] + want_need[i]].tolist())


def test_fractions_are_the_given_ones_or_ones():
    given = np.array([0.5, 1.0, 0.25])
    assert columns._fractions(given, 3) is given
    ones = columns._fractions(None, 4)
    assert ones.dtype == np.float64 and ones.tolist() == [1.0] * 4


@pytest.mark.parametrize("src,dst", [("RR+P01", "RS0"), ("S0R+P1", "RS0"),
                                     ("RS1+P0", "S0S1"), ("RR+P0", "RS0")])
@pytest.mark.parametrize("name", ["regular", "pieces", "odd hosts"])
def test_plans_of_chains_price_the_whole_plan(src, dst, name, monkeypatch):
    """Partial sources at 4x8: the columns' seconds are the whole plan's, where every own
    task is a chain and where some are not."""
    cluster = {"regular": Cluster.preset("dgx-h100", 8),
               "pieces": Cluster.regular(8, 8, relay_piece=1 << 14),
               "odd hosts": Cluster.from_hosts([range(5), range(5, 19), range(19, 64)])}[name]
    a = Layout(DeviceMesh((4, 8), range(32)), src)
    b = Layout(DeviceMesh((4, 8), range(32, 64)), dst)
    tensors = (make_tensor_spec((2048, 1024), "bfloat16", a, b, cluster),)
    if src == "RS1+P0":  # its cells kept a list: their sends tasks beside the chains
        monkeypatch.setattr(reduce, "_as_rows", lambda cells, steps, ndim: (cells, steps))
    ordered, _ = Builds().columns(tensors, cluster, Strategy.BROADCAST, False)
    want = ReshardPlan(tensors, ordered.tasks(), Strategy.BROADCAST, cluster).estimate()
    monkeypatch.setattr(chain_columns, "CHAINS_FROM", 1)
    every = []
    real = columns._routes

    def spy(objects, chains, *args):
        every.append(chains is not None and len(chains.index) == len(objects))
        return real(objects, chains, *args)

    monkeypatch.setattr(columns, "_routes", spy)
    assert estimate_columns(ordered, tensors, cluster) == want
    assert every and all(every) is (src != "RS1+P0")  # there: sends, and other tasks


@pytest.mark.parametrize("chains_from", [1, 10**9])
@pytest.mark.parametrize("every", [2, 3, 7])
def test_sends_beside_tasks_of_fractions_price_the_whole_plan(every, chains_from,
                                                              monkeypatch):
    """An all-to-all's sends among other tasks (a partial source's chains, one an
    all-gather: fractions under 1.0) at every ``every``-th place: the fractions laid into
    the sends' arrays are the tasks' own, and the seconds are the whole plan's."""
    cluster = Cluster.preset("dgx-h100", 8)
    mesh_a, mesh_b = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))
    tensors = (make_tensor_spec((2048, 512), "bfloat16", Layout(mesh_a, "S01R"),
                                Layout(mesh_b, "RS10"), cluster),)
    sends = Builds().columns(tensors, cluster, Strategy.SEND_RECV, False)[0].send_columns
    partial = (make_tensor_spec((2048, 512), "bfloat16", Layout(mesh_a, "RS1+P0"),
                                Layout(mesh_b, "S0S1"), cluster),)
    objects = list(Builds().columns(partial, cluster, Strategy.BROADCAST, False)[0].objects)
    first = objects[0]
    objects[len(objects) // 2] = Task(TaskKind.ALLGATHER, first.step, first.box, -1,
                                      (3, 9, 40, 41), 1 << 30)
    n = len(objects) + len(sends.position)
    at = [i * every for i in range(len(objects))]
    rest = np.setdiff1d(np.arange(n), at)
    mixed = OrderedTasks(objects, at, dataclasses.replace(sends, position=rest))
    want = ReshardPlan(tensors, mixed.tasks(), Strategy.SEND_RECV, cluster).estimate()
    monkeypatch.setattr(chain_columns, "CHAINS_FROM", chains_from)
    assert estimate_columns(mixed, tensors, cluster) == want

"""The ``trees`` passes' floor (reshard.planner.passes.tree_floor): never above the
model's prediction of the tree plan it stands for (``treeify`` built and priced here,
the brute-force oracle) for every tree form, on chains entering hosts with one to all
of their devices, hosts entered twice, a device twice (no form), relay-only devices,
a box's pieces repeating their chain, uneven hosts, relay fills, no intra-host
latency, several NICs or one a host, shared bandwidth and message costs; tight where
the trees' plan sits at its NICs' floor; 0 where a task is no chain the form reshapes
or the plan is too large; and the search plans exactly as without it, building no
tree plan where it rules a form out."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.cells import trees
from reshard.planner.cells.cell_tasks import split_box
from reshard.planner.cells.trees import TREE_FORMS, HostShape, Intra, treeify
from reshard.planner.ir import ReshardPlan
from reshard.planner.passes import stages, tree_floor
from reshard.planner.passes.tree_floor import MARGIN
from reshard.planner.plan import make_tensor_spec, plan_many, plan_tasks
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task, TaskKind

H100 = Cluster.preset("dgx-h100", 12)
UNEVEN = Cluster(tuple(tuple(range(s, s + n)) for s, n in
                       [(0, 4), (4, 8), (12, 16), (28, 2), (30, 8), (38, 5), (43, 8), (51, 8)]),
                 nic_bandwidth=4e10, latency=5e-6, intra_latency=0.0, relay_piece=1 << 16)
CLUSTERS = [
    H100,
    dataclasses.replace(H100, relay_piece=1 << 18, message_cost=2e-6),
    dataclasses.replace(Cluster.preset("aws-p3dn.24xlarge", 12), shared_bandwidth=1e11),
    UNEVEN,
]


def _tensors(cluster: Cluster, cols: int = 256) -> tuple:
    mesh = DeviceMesh((len(cluster.devices),), cluster.devices)
    return (make_tensor_spec((4096, cols), "float32", Layout(mesh, "RR"), Layout(mesh, "RR"),
                             cluster),)


def _chain(rng: random.Random, cluster: Cluster) -> list[Task]:
    """A chain over random hosts (host by host, 1 to all of each's devices), sometimes
    entering one again or naming a device twice, with relay-only devices; its box cut
    into one to three pieces that repeat it."""
    hosts = rng.sample(cluster.hosts, rng.randint(2, min(7, len(cluster.hosts))))
    devices: list[int] = []
    for h in hosts:
        devices += rng.sample(h, rng.randint(1, len(h)))
    if rng.random() < 0.15:
        devices.append(rng.choice([d for d in hosts[1] if d not in devices] or [devices[1]]))
    if rng.random() < 0.1:
        devices.append(devices[2])  # a device twice: no form
    through = tuple(d for d in devices[1:-1] if rng.random() < 0.15)
    rows = rng.choice([1, 3, 64])
    pieces = rng.randint(1, 3)
    return [Task(TaskKind.BROADCAST, 0, ((0, rows), (k * 64, k * 64 + 64)), devices[0],
                 tuple(devices[1:]), rows * 64 * 4, k, through=through)
            for k in range(pieces)]


def _priced(tasks: list[Task], cluster: Cluster, shape: HostShape, intra: Intra) -> float:
    tree = treeify(tasks, cluster.host_of, intra, shape)
    return ReshardPlan(_tensors(cluster), tree, Strategy.BROADCAST, cluster).estimate()


@pytest.mark.parametrize("cluster", CLUSTERS, ids=["h100", "fills", "shared", "uneven"])
def test_the_floor_is_never_above_the_tree_plan(cluster):
    rng = random.Random(len(cluster.devices))
    floored = 0
    for _ in range(40):
        tasks = [t for _ in range(rng.randint(1, 5)) for t in _chain(rng, cluster)]
        rng.shuffle(tasks)
        for shape, intra in TREE_FORMS:
            floor = tree_floor.tree_floor(tasks, cluster, shape, intra, {})
            if floor:
                floored += 1
                assert floor <= _priced(tasks, cluster, shape, intra), (shape, intra)
    assert floored >= 40  # the floor was found, not just 0


def _chain_plan(src: str, dst: str, shape=(8192, 8192)) -> ReshardPlan:
    a, b = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))
    cluster = Cluster.preset("dgx-h100", 8)
    tensors = (make_tensor_spec(shape, "bfloat16", Layout(a, src), Layout(b, dst), cluster),)
    tasks, _ = plan_tasks(tensors, cluster, Strategy.BROADCAST, fan_out=False)
    return ReshardPlan(tensors, tasks, Strategy.BROADCAST, cluster)


@pytest.mark.parametrize("src,dst", [("RR", "RR"), ("S01R", "RR"), ("RS1", "RR")])
def test_the_floor_is_the_plan_s_time_where_its_nics_bound_it(src, dst):
    plan = _chain_plan(src, dst)
    tight = 0
    for shape, intra in TREE_FORMS:
        floor = tree_floor.tree_floor(plan.tasks, plan.cluster, shape, intra, {})
        tree = ReshardPlan(plan.tensors, treeify(plan.tasks, plan.cluster.host_of, intra, shape),
                           Strategy.BROADCAST, plan.cluster).estimate()
        assert floor <= tree
        tight += tree * (1 - 2 * MARGIN) <= floor
    assert tight >= 4  # the least latency plus the busiest NIC: the model's own time


def test_no_floor_where_a_task_is_not_a_chain_the_form_reshapes():
    plan = _chain_plan("RR", "RR")
    cluster, tasks = plan.cluster, list(plan.tasks)
    t = tasks[0]
    assert tree_floor.tree_floor(tasks, cluster, HostShape.DOUBLE, Intra.STAR, {}) > 0
    send = Task(TaskKind.SEND, 0, t.box, t.root, t.receivers[:1], t.nbytes)
    summed = dataclasses.replace(t, parents=(t.root, *t.receivers[:-1]))
    one_remote = dataclasses.replace(t, receivers=t.receivers[:1])  # no form reshapes it
    for other in (send, summed, one_remote):
        for shape, intra in TREE_FORMS:
            assert tree_floor.tree_floor([*tasks, other], cluster, shape, intra, {}) == 0
    assert tree_floor.tree_floor([], cluster, HostShape.STAR, Intra.STAR, {}) == 0


def test_no_floor_for_a_large_plan(monkeypatch):
    plan = _chain_plan("RR", "RR")
    cluster = plan.cluster
    assert tree_floor.tree_floor(plan.tasks, cluster, HostShape.STAR, Intra.STAR, {}) > 0
    monkeypatch.setattr(tree_floor, "FLOOR_WORK", len(plan.tasks) * cluster.num_hosts - 1)
    assert tree_floor.tree_floor(plan.tasks, cluster, HostShape.STAR, Intra.STAR, {}) == 0


def test_forms_found_once_give_what_each_chain_gives_alone():
    rng = random.Random(5)
    for cluster in CLUSTERS:
        tasks = [t for _ in range(12) for t in _chain(rng, cluster)]
        sums: tree_floor.FormSums = {}
        memo: trees.Segments = {}
        for shape, intra in TREE_FORMS * 2:  # the second round reads the memos
            shared = tree_floor.tree_floor(tasks, cluster, shape, intra, memo, sums)
            alone = tree_floor.tree_floor(tasks, cluster, shape, intra, {}, {})
            assert shared == alone


_REQUESTS = [("RR", "RR"), ("S01R", "RR"), ("RS1", "RR"), ("S0R", "RS1"), ("S10R", "RR"),
             ("RR+P1", "RR"), ("S1R+P0", "RR"), ("RR+P0", "S1R")]


@pytest.mark.parametrize("shape", [(8192, 8192), (2048, 2048)])
def test_the_search_plans_the_same_with_and_without_the_floor(shape, monkeypatch):
    cluster = Cluster.preset("dgx-h100", 8)
    a, b = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))
    built: list[tuple[HostShape, Intra]] = []
    real = stages.treeify

    def spied(tasks, host, intra, form, memo=None):  # type: ignore[no-untyped-def]
        built.append((form, intra))
        return real(tasks, host, intra, form, memo)

    def plans() -> list[tuple[bytes, float]]:
        out = []
        for src, dst in _REQUESTS:
            p = plan_many([(shape, "bfloat16", Layout(a, src), Layout(b, dst))], cluster)
            out.append((p.digest(), p.estimate()))
        return out

    monkeypatch.setattr(stages, "treeify", spied)
    fast, with_floor = plans(), len(built)
    built.clear()
    no_floor = tuple(tuple(dataclasses.replace(p, floor=None) if p.name.startswith("trees")
                           else p for p in stage) for stage in stages.STAGES)
    monkeypatch.setattr(stages.search, "__defaults__",
                        (no_floor, *stages.search.__defaults__[1:]))
    assert plans() == fast
    assert with_floor < len(built)  # some form was ruled out before it was built


def test_a_box_s_pieces_repeating_their_chain_add_their_bytes():
    plan = _chain_plan("RR", "RR")
    pieces = [dataclasses.replace(t, box=half, nbytes=t.nbytes // 2)
              for t in plan.tasks for half in split_box(t.box, 2)]  # one receivers tuple
    memo: trees.Segments = {}
    chains = tree_floor.reshaped_chains(pieces, plan.cluster, HostShape.DOUBLE, memo)
    assert chains is not None and len(chains) == len(plan.tasks)  # a chain per two pieces
    for shape, intra in TREE_FORMS:
        floor = tree_floor.tree_floor(pieces, plan.cluster, shape, intra, {})
        tree = _priced_as(plan, pieces, shape, intra)
        assert tree * (1 - 2 * MARGIN) <= floor <= tree


def _priced_as(plan: ReshardPlan, tasks: list[Task], shape: HostShape, intra: Intra) -> float:
    tree = treeify(tasks, plan.cluster.host_of, intra, shape)
    return ReshardPlan(plan.tensors, tree, Strategy.BROADCAST, plan.cluster).estimate()


def test_the_least_latency_is_the_shallowest_tree_s():
    cluster = Cluster.preset("dgx-h100", 8)
    hosts = cluster.hosts
    wide = Task(TaskKind.BROADCAST, 0, ((0, 4096), (0, 4096)), hosts[0][0],
                (*hosts[1][:3], *hosts[2][:3], *hosts[3][:3]), 4096 * 4096 * 2)
    deep = Task(TaskKind.BROADCAST, 0, ((0, 1), (0, 8)), hosts[0][1],
                tuple(d for h in hosts[1:8] for d in h[1:]), 16)  # 7 hosts of 7
    tensors = _tensors(cluster, 4096)
    plan = ReshardPlan(tensors, (wide, deep), Strategy.BROADCAST, cluster)
    for shape, intra in TREE_FORMS:
        floor = tree_floor.tree_floor(plan.tasks, cluster, shape, intra, {})
        assert 0 < floor <= _priced_as(plan, list(plan.tasks), shape, intra)


def test_a_double_tree_s_halves_of_unlike_depths():
    cluster = Cluster.preset("dgx-h100", 8)
    hosts = cluster.hosts  # the eight-device host entered first: shallower in the first half
    receivers = (*hosts[1], hosts[2][0], hosts[3][0], hosts[4][0])
    task = Task(TaskKind.BROADCAST, 0, ((0, 4096), (0, 4096)), hosts[0][0], receivers,
                4096 * 4096 * 2)
    plan = ReshardPlan(_tensors(cluster, 4096), (task,), Strategy.BROADCAST, cluster)
    for intra in Intra:
        floor = tree_floor.tree_floor(plan.tasks, cluster, HostShape.DOUBLE, intra, {})
        tree = _priced_as(plan, [task], HostShape.DOUBLE, intra)
        assert tree * 0.99 <= floor <= tree  # (passing on as a chain: 26 and 31 us deep)

"""Broadcast trees (planner/cells/trees.py): shape, NIC loads, cost, verification, JSON, and
bytes on the local backend."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout, OptionError, PlanError, ReshardPlan
from reshard.planner.cells.trees import INTRA, MIN_HOSTS, SHAPES, HostShape, Intra, treeify
from reshard.planner.costing.cost import task_path
from reshard.planner.costing.verify import verify_plan
from reshard.planner.passes.stages import TREE_GAIN
from reshard.planner.plan import make_tensor_spec, plan_tasks
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task, TaskKind
from reshard.service.plan_codec import plan_from_pb, plan_to_pb

from ..common import check_shards, sample


def _chain_plan(cluster, shape, dtype, src, dst):
    tensors = (make_tensor_spec(shape, dtype, src, dst, cluster),)
    tasks, _ = plan_tasks(tensors, cluster, Strategy.BROADCAST, fan_out=False)
    return ReshardPlan(tensors, tasks, Strategy.BROADCAST, cluster)


def _loads(plan):
    """Bytes per resource over the plan's tasks."""
    out = collections.Counter()
    for t in plan.tasks:
        for res, frac in task_path(t, plan.cluster)[0]:
            out[res] += frac * t.nbytes
    return out


H100 = Cluster.regular(17, 8, preset="dgx-h100")
ROOT = Layout(DeviceMesh((1,), [0]), "RR")
ALL = Layout(DeviceMesh((16, 8), range(8, 136)), "RR")


@pytest.mark.parametrize("intra", INTRA)
def test_two_trees_keep_every_nic_load_and_cut_the_depth(intra):
    chain = _chain_plan(H100, (32000, 4096), "uint16", ROOT, ALL)
    tree = ReshardPlan(chain.tensors, treeify(chain.tasks, H100.host_of, intra),
                       chain.strategy, H100)
    verify_plan(tree)
    assert len(tree.tasks) == 2 * len(chain.tasks)
    host = H100.host_of
    for a, b in zip(tree.tasks[::2], tree.tasks[1::2]):
        assert a.nbytes + b.nbytes == chain.tasks[0].nbytes
        inner = [{host(p) for p, c in t.edges() if host(p) != host(c) and host(p) != 0}
                 for t in (a, b)]
        assert not inner[0] & inner[1]  # a host is inner in at most one of the pair
        assert len(inner[0] | inner[1]) >= 15
    # no NIC carries more than under the chain; the deepest receiver is 5 hosts away
    chain_nic = max(v for r, v in _loads(chain).items() if r[0].startswith("nic"))
    tree_nic = max(v for r, v in _loads(tree).items() if r[0].startswith("nic"))
    assert tree_nic <= chain_nic * (1 + 1e-9)
    lat = max(task_path(t, H100)[1] for t in tree.tasks)
    hops = 5 * H100.latency
    assert lat == pytest.approx(hops + (2 if intra is Intra.STAR else 8) * H100.intra_latency)
    assert tree.estimate() < chain.estimate()


def test_planner_uses_trees_where_the_model_says_so():
    p = reshard.plan((32000, 4096), "uint16", ROOT, ALL, cluster=H100)
    assert all(t.parents for t in p.tasks if t.kind is TaskKind.BROADCAST)
    assert p.estimate() / p.lower_bound() < 1.05  # was 1.63 as 8 chains
    # over two hosts two binary trees would be the chain: nothing to halve
    two = Layout(DeviceMesh((2, 8), range(8, 24)), "RR")
    chain = _chain_plan(H100, (4096, 2), "float32", ROOT, two)
    assert treeify(chain.tasks, H100.host_of, "star", "double") == chain.tasks
    assert MIN_HOSTS == 3


@pytest.mark.parametrize("shape", SHAPES)
def test_every_form_delivers_the_same_bytes_and_the_planner_keeps_the_fastest(shape):
    # a small box to three hosts: latency-bound, where hop counts decide
    dst = Layout(DeviceMesh((3, 8), range(8, 32)), "RR")
    chain = _chain_plan(H100, (64, 64), "float32", ROOT, dst)
    for intra in INTRA:
        form = ReshardPlan(chain.tensors, treeify(chain.tasks, H100.host_of, intra, shape),
                           chain.strategy, H100)
        verify_plan(form)
        assert form.tasks != chain.tasks
        best = reshard.plan((64, 64), "float32", ROOT, dst, cluster=H100)
        assert best.estimate() <= min(form.estimate(), chain.estimate()) * (1 + TREE_GAIN)


def _tree_task(**kw):
    base = Task(TaskKind.BROADCAST, 0, ((0, 8),), 0, (2, 4, 3, 6), 32,
                parents=(0, 2, 2, 4))
    return dataclasses.replace(base, **kw)


CL = Cluster.regular(4, 2)


def _plan_of(task):
    src = Layout(DeviceMesh((1,), [0]), "R")
    dst = Layout(DeviceMesh((4,), [2, 3, 4, 6]), "R")
    t = make_tensor_spec((8,), "float32", src, dst, CL)
    return ReshardPlan((t,), (task,), Strategy.BROADCAST, CL)


def test_verifier_accepts_a_tree_and_refuses_broken_ones():
    verify_plan(_plan_of(_tree_task()))
    bad = {
        "one parent per receiver": _tree_task(parents=(0, 2, 2)),
        "neither the root nor an earlier receiver": _tree_task(parents=(0, 3, 2, 4)),
        "leaves of the tree": _tree_task(receivers=(2, 4, 3, 6, 5), through=(5,),
                                         parents=(0, 2, 2, 4, 6)),
    }
    for rule, task in bad.items():
        with pytest.raises(PlanError, match=rule):
            verify_plan(_plan_of(task))
    send = Task(TaskKind.SEND, 0, ((0, 8),), 0, (2,), 32, parents=(0,))
    with pytest.raises(PlanError, match="only a broadcast has a tree"):
        verify_plan(_plan_of(send))


def test_parents_survive_json_and_the_service_codec():
    p = reshard.plan((32000, 64), "float32", ROOT, ALL, cluster=H100)
    assert any(t.parents for t in p.tasks)
    assert ReshardPlan.from_json(p.to_json()).tasks == p.tasks
    assert plan_from_pb(plan_to_pb(p)).tasks == p.tasks


@pytest.mark.parametrize("intra", INTRA)
@pytest.mark.parametrize("shape,dtype,src,dst", [
    ((37, 5), "int32", Layout(DeviceMesh((1,), [0]), "RR"),
     Layout(DeviceMesh((3, 2), [2, 3, 4, 5, 6, 7]), "S1R")),
    ((11, 6), "float64", Layout(DeviceMesh((1, 2), [0, 1]), "S1R"),
     Layout(DeviceMesh((3, 2), [2, 3, 4, 5, 6, 7]), "RR")),
    ((5, 4, 3), "uint8", Layout(DeviceMesh((2,), [0, 2]), "RS0R"),
     Layout(DeviceMesh((2, 2), [3, 4, 6, 7]), "RRR")),
])
def test_tree_plans_exact_on_the_local_backend(shape, dtype, src, dst, intra):
    chain = _chain_plan(CL, shape, dtype, src, dst)
    plan = ReshardPlan(chain.tensors, treeify(chain.tasks, CL.host_of, intra),
                       chain.strategy, CL)
    verify_plan(plan)
    value = sample(np.random.default_rng(3), shape, dtype)
    with reshard.Runtime("local", CL, "thread") as rt:
        x = rt.put(value, src)
        check_shards(rt, rt.execute(plan, [x])[0], value)


def test_forms_are_named_choices():
    """A form is an enum member or its name; anything else is refused, listing them."""
    chain = _chain_plan(H100, (32000, 4096), "uint16", ROOT, ALL)
    assert treeify(chain.tasks, H100.host_of, "star", "double") == treeify(
        chain.tasks, H100.host_of, Intra.STAR, HostShape.DOUBLE)
    with pytest.raises(OptionError, match=r"'ring'.*'star'.*'chain'"):
        treeify(chain.tasks, H100.host_of, "ring")
    with pytest.raises(OptionError, match=r"'double'.*'chain'.*'star'"):
        treeify(chain.tasks, H100.host_of, "star", "binary")

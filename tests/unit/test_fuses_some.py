"""The fused passes' pre-check (reshard.planner.passes.stages.fuses_some) answers as the
scan it replaced: whether the first plan has a reduction of a tensor that fuses, on
requests whose tensors fuse (float32 sums), do not (bf16 sums accumulate in float32),
mix both, or carry no reduction at all."""

from __future__ import annotations

import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.ir import ReshardPlan
from reshard.planner.passes import stages as passes
from reshard.planner.plan import make_tensor_spec, plan_tasks
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import TaskKind

CLUSTER = Cluster.regular(4, 2)
SRC = DeviceMesh((2, 2))
DST = DeviceMesh((2, 2), range(4, 8))
REQUESTS = {
    "float32 sum": [((64, 64), "float32", "S0R+P1", "RS0")],
    "bf16 sum": [((64, 64), "bfloat16", "S0R+P1", "RS0")],
    "bf16 and float32 sums": [((64, 64), "bfloat16", "RR+P1", "RR"),
                              ((32, 64), "float32", "S0R+P1", "RS0")],
    "no sum": [((64, 64), "float32", "S0R", "RS0")],
}


def _old_scan(search: passes.Search) -> bool:
    """The expression ``_fused`` evaluated before ``fuses_some``."""
    tensors = search.tensors
    return any(t.kind is TaskKind.REDUCE and tensors[t.tensor].fuses
               for t in search.first.tasks)


def _search(name: str) -> passes.Search:
    tensors = tuple(make_tensor_spec(shape, dtype, Layout(SRC, s), Layout(DST, d), CLUSTER)
                    for shape, dtype, s, d in REQUESTS[name])
    tasks, pipelined = plan_tasks(tensors, CLUSTER, Strategy.BROADCAST, fan_out=False)
    first = ReshardPlan(tensors, tasks, Strategy.BROADCAST, CLUSTER)
    return passes.Search(tensors, CLUSTER, Strategy.BROADCAST, first, pipelined, plan_tasks)


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_fuses_some_answers_as_the_scan(name):
    search = _search(name)
    assert passes.fuses_some(search) == _old_scan(search)


def test_the_cases_cover_both_answers():
    """The float32 sums fuse (the fused passes propose), the bf16 sum and the plain
    source do not: a pre-check answering one constant fails one of the above."""
    answers = {name: passes.fuses_some(_search(name)) for name in REQUESTS}
    assert answers == {"float32 sum": True, "bf16 sum": False,
                       "bf16 and float32 sums": True, "no sum": False}

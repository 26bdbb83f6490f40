"""One device's share of a plan, without building the rest.

An SPMD rank (:mod:`reshard.comm.spmd`) needs two things of the plan every rank makes:
its own tasks and the plan's digest, which it compares with its peers'. Building
every task object of a large plan costs most of its planning (a million sends of a
1,024 -> 1,024 all-to-all: seconds and hundreds of MB), though a rank keeps about two
thousand of them. :func:`plan_share` plans as :func:`reshard.plan_many` does, keeps the
sends as the planner's columns (:class:`~reshard.planner.schedule.send_columns.OrderedTasks`), digests
the whole plan from them (:mod:`reshard.planner.values.digest`: the same digest as
:meth:`ReshardPlan.digest` of the whole plan) and builds only the device's tasks.

That shortcut applies where the plan is the planner's first answer: more tasks than
:data:`~reshard.planner.passes.stages.ALTERNATIVES_UP_TO` (no alternative is costed against it), no
memory budget (bucketing reads every task) and no scaled cast (two phases). Otherwise
the whole plan is built and cut; the share is the same either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from reshard.cluster import Cluster
from reshard.dtypes import ScaleMode
from reshard.gcpause import paused
from reshard.planner.ir import ReshardPlan, plan_header
from reshard.planner.passes.stages import ALTERNATIVES_UP_TO
from reshard.planner.plan import ordered_tasks, phased, plan_tensors, planned_tensors
from reshard.planner.schedule.staging import check_budget
from reshard.planner.values.digest import digest
from reshard.planner.values.request import Request
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task, TensorSpec


@dataclass(frozen=True, eq=False)
class PlanShare:
    """``device``'s share of a plan.

    Attributes:
        device: whose share.
        tensors: the plan's tensors.
        strategy: the plan's strategy.
        cluster: the plan's cluster.
        tasks: the device's ``(index in the plan, task)`` pairs, in the plan's order.
        groups: every communicator member set of the plan, in first-use order
            (:meth:`ReshardPlan.communicator_groups`).
        digest: the whole plan's :meth:`ReshardPlan.digest`.
        size: tasks in the whole plan.
        plan: the whole plan, when it was built (else None).
    """

    device: int
    tensors: tuple[TensorSpec, ...]
    strategy: Strategy
    cluster: Cluster
    tasks: tuple[tuple[int, Task], ...]
    groups: tuple[tuple[int, ...], ...]
    digest: bytes
    size: int
    plan: ReshardPlan | None = None

    @classmethod
    def of_plan(cls, plan: ReshardPlan, device: int) -> PlanShare:
        """``device``'s share of a whole plan."""
        with paused():
            tasks = tasks_of(plan.tasks, (device,))[device]
        return cls(device, plan.tensors, plan.strategy, plan.cluster, tuple(tasks),
                   plan.communicator_groups(), plan.digest(), len(plan.tasks), plan)


def plan_share(requests: Iterable[Request], device: int, cluster: Cluster | None = None,
               strategy: str | Strategy = Strategy.BROADCAST, *, cast: object = None,
               scale: str | ScaleMode | None = None, memory_budget: int | None = None,
               whole: bool = False) -> PlanShare:
    """``device``'s share of ``plan_many(requests, cluster, strategy, ...)`` (the same
    arguments, the same plan), building only its tasks where the plan allows it (see
    the module docstring); ``whole``: build the whole plan anyway (to verify it).

    Raises:
        ReshardError: as :func:`reshard.plan_many` does.
    """
    check_budget(memory_budget)
    strat = Strategy.parse(strategy)
    tensors, cluster = planned_tensors(requests, cluster, cast, scale)
    if memory_budget is None and not whole and not phased(tensors):
        with paused():
            ordered, _ = ordered_tasks(tensors, cluster, strat, fan_out=False)
            if len(ordered) > ALTERNATIVES_UP_TO:
                sends, positions, others = ordered.sends()
                return PlanShare(device, tensors, strat, cluster, tuple(ordered.of(device)),
                                 ordered.groups(),
                                 digest(plan_header(tensors, strat, cluster), sends,
                                        positions, others), len(ordered))
    return PlanShare.of_plan(plan_tensors(tensors, cluster, strat, memory_budget), device)


def tasks_of(plan_tasks: Sequence[Task],
             wanted: tuple[int, ...]) -> dict[int, list[tuple[int, Task]]]:
    """Each wanted device's ``(index, task)`` list, in one pass over the plan (one
    device, an SPMD rank's case: a test of its own id per task, without building
    every task's device tuple)."""
    if len(wanted) == 1:
        d = wanted[0]
        return {d: [(i, t) for i, t in enumerate(plan_tasks)
                    if t.root == d or d in t.receivers or d in t.addends]}
    tasks: dict[int, list[tuple[int, Task]]] = {d: [] for d in wanted}
    for i, task in enumerate(plan_tasks):
        for d in task.devices:
            mine = tasks.get(d)
            if mine is not None:
                mine.append((i, task))
    return tasks


__all__ = ["PlanShare", "plan_share", "tasks_of"]

"""Candidates of one planning call priced once each.

The passes and the baselines of one planning call often propose the same tasks again:
a tree form that reshapes nothing a two-host chain has, ``point-to-point`` and the
``send_recv`` baseline's first plan, a baseline's ``finer`` cut that splits no cell.
The model reads a plan's tensors, tasks and cluster, never its label, so such a
candidate takes the prediction of the first plan that had them
(:meth:`~reshard.planner.ir.ReshardPlan.priced_as`) instead of being simulated again:
the same numbers, found once.
"""

from __future__ import annotations

from reshard.planner.ir import ReshardPlan


class Twins:
    """The distinct plans of a planning call so far, by their tensors and tasks (a
    memo local to that call)."""

    def __init__(self) -> None:
        self._by_hash: dict[int, list[ReshardPlan]] = {}

    def adopt(self, plan: ReshardPlan) -> ReshardPlan:
        """``plan``, priced as the first plan of the call with its tensors, tasks and
        cluster where there is one (else remembered as that first plan)."""
        tasks = plan.tasks  # a few tasks name it (equal plans share it; others compare)
        sample = (tasks[0], tasks[len(tasks) // 2], tasks[-1]) if tasks else ()
        same = self._by_hash.setdefault(hash((plan.tensors, len(tasks), sample)), [])
        for other in same:
            if other.tasks == plan.tasks and other.tensors == plan.tensors and (
                    other.cluster is plan.cluster or other.cluster == plan.cluster):
                return plan.priced_as(other)
        same.append(plan)
        return plan


__all__ = ["Twins"]

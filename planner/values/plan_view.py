"""What the cost model and the verifier read of a plan: its tensors, tasks, cluster and
the tasks' routes. :class:`~reshard.planner.ir.ReshardPlan` is one; the costing stage
names this protocol, not the IR, so that no import runs from it up to the IR, not even
for types."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.values.resources import Resource
from reshard.planner.values.tasks import Task, TensorSpec

Route = tuple[list[tuple[Resource, float]], float]
"""A task's route: the resources its bytes cross (with the fraction on each), and its
fixed latency."""


class PlanView(Protocol):
    """A plan as the costing stage reads it."""

    @property
    def tensors(self) -> tuple[TensorSpec, ...]:
        """The plan's tensors."""
        ...

    @property
    def tasks(self) -> tuple[Task, ...]:
        """The plan's tasks, in the global order."""
        ...

    @property
    def cluster(self) -> Cluster:
        """The hosts and links the plan is for."""
        ...

    def routes(self, known: dict[tuple[object, ...], Any] | None = None) -> Sequence[Route]:
        """Every task's route (cached)."""
        ...

    def latencies(self) -> np.ndarray:
        """Per task, the seconds before its bytes flow once it may start: its route's
        latency and its wait for its devices' conversions
        (:func:`reshard.planner.costing.casts.task_latencies`; cached)."""
        ...


__all__ = ["PlanView", "Route"]

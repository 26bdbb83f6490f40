"""Memory per device as a pipeline schedule holds it.

A candidate holds ``memory`` bytes per device whatever the schedule (weights, gradients,
optimizer state, working buffers) and ``activations`` bytes per device for each
microbatch whose forward it has run and whose backward it has not finished: how many
such microbatches a stage holds at once is the schedule's (its *in-flight* count, by
the stage's place in the pipeline):

* ``1f1b``: stage ``s`` of ``p`` holds ``min(B, p - s)``;
* ``eager-1f1b``: ``min(B, 2 (p - s) - 1)``;
* a virtual-stage schedule (interleaved 1F1B, ZB-V, DualPipeV): each piece (chunk of a
  submesh) the most its own chunk holds at once in the schedule's program
  (:func:`reshard.pipeline.make_schedule`; a forward adds one, a full backward or a
  weight-gradient step takes it away).

A stage's memory is its candidates' ``memory`` plus its in-flight count times their
``activations``. With virtual stages a submesh holds several pieces; the search holds
each piece to ``1 / chunks`` of the limit, so the submesh's sum is within it
(:func:`device_memory` gives the sum itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reshard.errors import ReshardError, SearchError
from reshard.pipeline.actions import ActionKind
from reshard.pipeline.generators import CHECKED, make_schedule
from reshard.pipeline.schedule import Schedule
from reshard.search.kinds import SearchSchedule
from reshard.search.model import Budget, Choice, Layer
from reshard.search.objective import named_candidates

_ADDS = {ActionKind.FORWARD: 1, ActionKind.BACKWARD: -1, ActionKind.BACKWARD_WEIGHT: -1}
"""How a compute action changes a chunk's count of activations held."""


def chain_in_flight(schedule: SearchSchedule, to_go: int, microbatches: int) -> int:
    """A one-chunk stage's in-flight count with ``to_go`` stages from it to the end
    (itself included: ``p - s``)."""
    if schedule.traits.eager:
        return min(microbatches, 2 * to_go - 1)
    return min(microbatches, to_go)


@dataclass
class Orders:
    """The pipeline schedules a search builds, each once (ZB-V's list scheduling takes
    seconds for 16 stages of 128 microbatches): by (name, stages, microbatches,
    chunks); ``budget``: the search's, checked before each build and, for the builds
    that take a check (:data:`reshard.pipeline.generators.CHECKED`: ZB-V's), now and
    then inside one."""

    built: dict[tuple[str, int, int, int], Schedule] = field(default_factory=dict)
    budget: Budget | None = None

    def get(self, name: str, stages: int, microbatches: int, chunks: int) -> Schedule:
        """:func:`reshard.pipeline.make_schedule`'s schedule (``n_chunks`` given to
        interleaved 1F1B); ReshardError as it raises them."""
        key = (name, stages, microbatches, chunks)
        if key not in self.built:
            options: dict[str, Any] = {"n_chunks": chunks} if name == "interleaved-1f1b" \
                else {}
            budget = self.budget
            if budget is not None:
                def check() -> None:
                    budget.check("building the {} pipeline schedule of {} submeshes and {} "
                                 "microbatches", name, stages, microbatches)

                check()
                if name in CHECKED:
                    options["check"] = check
            self.built[key] = make_schedule(name, stages, microbatches, **options)
        return self.built[key]


def in_flight(schedule: SearchSchedule, stages: int, chunks: int,
              microbatches: int, orders: Orders | None = None) -> tuple[int, ...]:
    """Per piece of a pipeline of ``stages`` submeshes (``stages * chunks`` pieces, in
    pipeline order), the most microbatches whose activations it holds at once
    (module docstring); ``orders``: the search's schedules, kept."""
    if not schedule.virtual:
        return tuple(chain_in_flight(schedule, stages - s, microbatches)
                     for s in range(stages))
    try:
        order = (Orders() if orders is None else orders).get(schedule.value, stages,
                                                             microbatches, chunks)
    except ReshardError as e:
        raise SearchError(f"schedule {schedule.value!r} on {stages} submeshes with "
                          f"{microbatches} microbatches: {e}") from None
    most = [0] * (stages * chunks)
    for s, program in enumerate(order.stages):
        held = [0] * chunks
        for action in program:
            held[action.chunk] += _ADDS.get(action.kind, 0)
            piece = order.virtual_stage(s, action.chunk)
            most[piece] = max(most[piece], held[action.chunk])
    return tuple(most)


def stage_memory(layers: Sequence[Layer], choice: Choice,
                 orders: Orders | None = None) -> tuple[int, ...]:
    """Per stage (piece) of ``choice``, the bytes per device it holds as its schedule
    holds them."""
    stages = choice.stages
    schedule = SearchSchedule(choice.schedule)
    p = len(stages) // choice.chunks
    counts = in_flight(schedule, p, choice.chunks, choice.microbatches, orders)
    cands = named_candidates(layers, stages)
    return tuple(sum(c.memory + counts[i] * c.activations
                     for c in cands[st.first:st.last + 1]) for i, st in enumerate(stages))


def device_memory(layers: Sequence[Layer], choice: Choice,
                  orders: Orders | None = None) -> tuple[int, ...]:
    """Per submesh of ``choice`` (in the order its first piece runs), the bytes per
    device of all the pieces it holds."""
    out: dict[object, int] = {}
    for st, mem in zip(choice.stages, stage_memory(layers, choice, orders)):
        out[st.placement] = out.get(st.placement, 0) + mem
    return tuple(out.values())


__all__ = ["Orders", "chain_in_flight", "device_memory", "in_flight", "stage_memory"]

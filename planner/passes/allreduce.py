"""All-reduce first: a candidate plan for partial sums whose meshes coincide.

Where a partial sum's devices all hold part of the destination too (DTensor's
``Partial -> Replicate`` and ``Partial -> Shard`` on one mesh), the backend's own
all-reduce is a candidate (:data:`~reshard.planner.values.tasks.TaskKind.ALLREDUCE`: gloo's
and NCCL's ring, each member sending and receiving 2(k-1)/k of the box, against a
reduction into one root and a broadcast of the sum, each member at least once the box
each way). The candidate all-reduces every partial group's box in step 0; then every
member holds the sum of its box (in its destination shard where that holds the box,
else in its private source copy), which is the source layout with its partial axes
replicated, and the rest of the plan moves that layout to the destination as any other
(planned by the caller's planner, one step later, less the local copies of what
landed in place). The
caller keeps whichever plan the model says is faster (:func:`reshard.planner.plan`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from reshard.cluster import Cluster
from reshard.dtypes import ScaleMode
from reshard.layout import Box, Layout, box_size, box_within, boxes_meet
from reshard.planner.ir import ReshardPlan
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Buffer, Derive, Task, TaskKind, TensorSpec, delivers

Planner = Callable[[tuple[TensorSpec, ...], Cluster, Strategy], ReshardPlan]
"""Plans tensors whose sources are no partial sums (the caller's best plan)."""


def applies(t: TensorSpec) -> bool:
    """Whether tensor ``t`` gets the all-reduce: a partial sum the caller gave (not a
    scaled cast's amax, nor scaled itself) into a destination that is none, whose every
    source device takes part in the destination (where the meshes coincide, or the
    destination's covers the source's)."""
    return (t.src.spec.is_partial and t.derive is Derive.NONE
            and t.scale is ScaleMode.NONE and not t.dst.spec.is_partial
            and set(t.src.devices) <= set(t.dst.devices))


def reduced(t: TensorSpec) -> TensorSpec:
    """``t`` once its partial sums are all-reduced: every member holds the sum of its
    box (the partial mesh axes replicate)."""
    src = Layout(t.src.mesh, replace(t.src.spec, partial=()))
    return replace(t, src=src)


def allreduce_tasks(t: TensorSpec, index: int) -> list[Task]:
    """Step 0: one ALLREDUCE per partial group (of two or more addends) of tensor
    ``index``, over the box its members hold, carried in the accumulator."""
    boxes = t.src.boxes(t.shape)
    out = []
    for group in t.src.partial_groups():
        box = boxes[group[0]]
        if len(group) > 1 and box_size(box):
            out.append(Task(TaskKind.ALLREDUCE, index, box, -1, tuple(sorted(group)),
                            box_size(box) * t.sum_itemsize))
    return out


def allreduce_first(tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy,
                    planner: Planner) -> ReshardPlan | None:
    """The all-reduce-first plan of ``tensors`` (module docstring), or None where no
    tensor gets an all-reduce (:func:`applies`)."""
    chosen = [i for i, t in enumerate(tensors) if applies(t)]
    if not chosen:
        return None
    first: list[Task] = []
    mids = list(tensors)
    # where a member's destination shard holds its box, the sum lands there: the rest
    # plan's local copy of it goes; a plan that reads it from the source there is none
    landed: dict[tuple[int, int], list[Box]] = {}
    for i in chosen:
        mine = allreduce_tasks(tensors[i], i)
        dst = tensors[i].dst.boxes(tensors[i].shape)
        for a in mine:
            for m in a.receivers:
                if delivers(dst.get(m), a.box):
                    landed.setdefault((i, m), []).append(a.box)
        first += mine
        mids[i] = reduced(tensors[i])
    shift = 1 if first else 0
    tasks = list(first)
    for x in planner(tuple(mids), cluster, strat).tasks:
        boxes = landed.get((x.tensor, x.root), ())
        if x.kind is TaskKind.COPY and any(box_within(x.box, b) for b in boxes):
            continue
        if x.source is Buffer.SRC and any(boxes_meet(x.box, b) for b in boxes):
            return None
        tasks.append(replace(x, step=x.step + shift))
    return ReshardPlan(tensors, tuple(tasks), strat, cluster)


__all__ = ["allreduce_first", "allreduce_tasks", "applies", "reduced"]

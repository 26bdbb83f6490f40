"""Plans <-> ``reshard.v1.Plan`` messages, whole or in chunks, and their costs.

Encoding reads the plan's objects; decoding checks what :meth:`ReshardPlan.from_dict`
checks of JSON: the format version, each task through :meth:`Task.from_dict` (strict
types), the core types' own constructors, and (unless told otherwise) the verifier.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from reshard.errors import PlanError
from reshard.layout import Box
from reshard.planner.ir import ReshardPlan
from reshard.planner.values.tasks import (
    FORMAT_VERSION,
    READABLE_FORMATS,
    Buffer,
    Task,
    TaskKind,
    task_dict,
)
from reshard.service.convert import (
    STRATEGY,
    cluster_from_pb,
    cluster_to_pb,
    tensor_spec_from_pb,
    tensor_spec_to_pb,
)
from reshard.service.enums import EnumPair
from reshard.service.v1 import reshard_pb2 as pb

TASK_KIND = EnumPair(TaskKind, pb.TaskKind, "TASK_KIND_")
BUFFER = EnumPair(Buffer, pb.Buffer, "BUFFER_", unspecified=Buffer.SRC)

DEFAULT_CHUNK_TASKS = 4096
"""Tasks per streamed chunk unless the request asks for fewer (about 0.5 MB)."""


# ----- encoding -------------------------------------------------------------------------
def _box_pb(box: Box) -> pb.Box:
    return pb.Box(dims=[pb.Range(start=a, stop=b) for a, b in box])


def task_to_pb(t: Task) -> pb.Task:
    """A task message."""
    return pb.Task(kind=TASK_KIND.to_pb[t.kind], tensor=t.tensor, box=_box_pb(t.box), root=t.root,
                   receivers=t.receivers, nbytes=t.nbytes, step=t.step,
                   source=BUFFER.to_pb[t.source], pieces=[_box_pb(p) for p in t.pieces],
                   through=t.through, parents=t.parents, addends=t.addends,
                   addend_parents=t.addend_parents)


def header_to_pb(plan: ReshardPlan, into: pb.Plan | None = None) -> pb.Plan:
    """Every field of the plan's message but the tasks (written into ``into`` if given)."""
    msg = pb.Plan() if into is None else into
    msg.format = FORMAT_VERSION
    msg.strategy = STRATEGY.to_pb[plan.strategy]
    msg.cluster.CopyFrom(cluster_to_pb(plan.cluster))
    msg.tensors.extend(tensor_spec_to_pb(t) for t in plan.tensors)
    return msg


def plan_to_pb(plan: ReshardPlan, into: pb.Plan | None = None) -> pb.Plan:
    """The whole plan as one message (written into ``into`` if given, e.g. a reply's
    field, which saves copying a large plan)."""
    msg = header_to_pb(plan, into)
    msg.tasks.extend(task_to_pb(t) for t in plan.tasks)
    return msg


def cost_to_pb(plan: ReshardPlan) -> pb.Cost:
    """The cost model's prediction and the lower bound of ``plan`` (cached on the plan)."""
    return pb.Cost(seconds=plan.estimate(), lower_bound_seconds=plan.lower_bound(),
                   num_tasks=len(plan.tasks), num_steps=plan.num_steps,
                   bytes_moved=plan.bytes_moved())


def _groups(sizes: list[int], first_budget: int, budget: int, max_tasks: int
            ) -> list[tuple[int, int]]:
    """``(start, stop)`` ranges of tasks, each at most ``max_tasks`` tasks and (unless a
    single task is larger) ``budget`` bytes, the first ``first_budget``."""
    out: list[tuple[int, int]] = []
    start, used, room = 0, 0, first_budget
    for i, size in enumerate(sizes):
        if i > start and (used + size > room or i - start >= max_tasks):
            out.append((start, i))
            start, used, room = i, 0, budget
        used += size
    out.append((start, len(sizes)))
    return out


def plan_chunks(plan: ReshardPlan, max_tasks: int, max_bytes: int,
                cost: pb.Cost | None = None) -> list[pb.PlanChunk]:
    """The plan in chunks of at most ``max_tasks`` tasks and about ``max_bytes`` bytes
    each (a single larger task, or a larger header, gets a chunk of its own): the first
    carries the header (and ``cost``), every one its share of the tasks; merging the
    parts in order gives :func:`plan_to_pb`'s message."""
    header = header_to_pb(plan)
    tasks = [task_to_pb(t) for t in plan.tasks]
    sizes = [t.ByteSize() + 4 for t in tasks]  # + field tag and length
    head = header.ByteSize() + (cost.ByteSize() if cost is not None else 0) + 64
    groups = _groups(sizes, max_bytes - head, max_bytes - 64, max(1, max_tasks))
    chunks = []
    for i, (a, b) in enumerate(groups):
        part = header if i == 0 else pb.Plan()
        part.tasks.extend(tasks[a:b])
        chunk = pb.PlanChunk(index=i, count=len(groups), part=part)
        if i == 0 and cost is not None:
            chunk.cost.CopyFrom(cost)
        chunks.append(chunk)
    return chunks


# ----- decoding -------------------------------------------------------------------------
def _box_list(m: pb.Box) -> list[list[int]]:
    return [[r.start, r.stop] for r in m.dims]


def _task_dict(m: pb.Task) -> dict[str, Any]:
    kind = TASK_KIND.decode(m.kind, "kind", PlanError)
    source = BUFFER.decode(m.source, "source", PlanError)
    return task_dict({
        "kind": kind.value, "tensor": m.tensor, "box": _box_list(m.box), "root": m.root,
        "receivers": list(m.receivers), "nbytes": m.nbytes, "step": m.step,
        "source": source.value, "pieces": [_box_list(p) for p in m.pieces],
        "through": list(m.through), "parents": list(m.parents), "addends": list(m.addends),
        "addend_parents": list(m.addend_parents)})


def plan_from_pb(m: pb.Plan, verify: bool = True) -> ReshardPlan:
    """The plan of a message, checked as :meth:`ReshardPlan.from_dict` checks JSON: the
    format version, strict task fields (:meth:`Task.from_dict`), and the verifier.

    Args:
        m: the message.
        verify: run the plan verifier (pass False only for a plan a verifying party
            already checked).

    Raises:
        PlanError: a malformed or inconsistent plan (the message names task and rule).
    """
    if m.format not in READABLE_FORMATS:
        raise PlanError(f"plan format {m.format} is not supported; this reshard reads "
                        f"formats {list(READABLE_FORMATS)}")
    strategy = STRATEGY.decode(m.strategy, "plan strategy", PlanError)
    cluster = cluster_from_pb(m.cluster)
    if cluster is None:
        raise PlanError("plan has no cluster; a plan carries the cluster it was made for")
    tensors = tuple(tensor_spec_from_pb(t, f"plan tensor {i}") for i, t in enumerate(m.tensors))
    tasks = []
    for i, t in enumerate(m.tasks):
        try:
            tasks.append(Task.from_dict(_task_dict(t)))
        except PlanError as e:
            raise PlanError(f"task #{i}: {e}") from None
    plan = ReshardPlan(tensors, tuple(tasks), strategy, cluster)
    if verify:
        plan.verify()
    return plan


def merge_chunks(chunks: Iterable[pb.PlanChunk]) -> tuple[pb.Plan, pb.Cost | None]:
    """The whole plan message of a stream of chunks (and the cost, if sent).

    Raises:
        PlanError: chunks missing, repeated or out of order.
    """
    plan = pb.Plan()
    cost: pb.Cost | None = None
    expected = None
    n = 0
    for chunk in chunks:
        if chunk.index != n or (expected is not None and chunk.count != expected):
            raise PlanError(f"plan chunk {chunk.index} of {chunk.count} arrived as number {n} "
                            f"(of {expected}); the stream is broken, ask again")
        expected = chunk.count
        if n == 0 and chunk.HasField("cost"):
            cost = chunk.cost
        plan.MergeFrom(chunk.part)
        n += 1
    if expected is None or n != expected:
        raise PlanError(f"plan stream ended after {n} of {expected} chunks; ask again")
    return plan, cost

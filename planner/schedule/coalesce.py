"""Coalescing: small transfers of one step that share their route travel as one message.

A weight sync moves hundreds of small tensors (norms, biases: Llama-2-7B has 65
4096-element norms among its 291 tensors), and each transfer costs a backend
operation and a network latency beyond its bytes. Within one step, the sends and
broadcasts that share kind, root, receivers, chain or tree and relays (and sum no
addends) are one message on every device they involve: each device lays their
scratch regions side by side in plan order (:func:`reshard.comm.steps.program_steps`),
the root packs every box into its region, the first task of the group issues one
operation over the whole run of bytes, and each receiver unpacks every box from its
region. Every device of the group computes the same groups from the tasks alone (they
are in each of its programs, in the same order), so no plan field says it and the
verifier checks the tasks as they are. The cost model does not see it: its tasks of
one step spend their latencies concurrently, and it has no per-operation overhead
(the backend's cost of a message beyond its bytes), which is what coalescing saves.

Only tasks of at most :data:`TASK_BYTES` are coalesced (a large box gains nothing: its
bytes dominate, and it keeps its zero-copy path), into messages of at most
:data:`MESSAGE_BYTES`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from reshard.planner.schedule.staging import step_runs, task_staging
from reshard.planner.values.tasks import Conversion, Task, TaskKind

TASK_BYTES = 256 << 10
"""The largest box (its staging region, bytes) a coalesced task may carry."""

MESSAGE_BYTES = 8 << 20
"""The largest coalesced message (the sum of its tasks' regions, bytes)."""

X = TypeVar("X")

_COALESCED = (TaskKind.SEND, TaskKind.BROADCAST)


def route(task: Task, tensor: Conversion) -> tuple[Any, ...] | None:
    """What ``task`` shares with the tasks it may travel with (None: it travels alone):
    its kind, root, receivers in order, tree and relays, for a SEND or BROADCAST that
    sums no addends and stages at most :data:`TASK_BYTES`."""
    return _route_and_size(task, tensor)[0]


def _route_and_size(task: Task, tensor: Conversion,
                    staged: int | None = None) -> tuple[tuple[Any, ...] | None, int]:
    """:func:`route` and the task's staging bytes (0 when it travels alone), computed
    once (a worker's load runs it for every task of its program); ``staged``: those
    bytes, when the caller has them."""
    if task.kind not in _COALESCED or task.addends:
        return None, 0
    n = task_staging(task, tensor) if staged is None else staged
    if n > TASK_BYTES:
        return None, 0
    return (task.kind._value_, task.root, task.receivers, task.parents, task.through), n


def messages(step: Sequence[X], task_of: Callable[[X], Task],
             tensor_of: Callable[[Task], Conversion],
             staged: Callable[[X], int] | None = None) -> list[list[X]]:
    """The coalesced messages of one step's items (tasks in plan order, or objects
    holding them): lists of at least two items sharing a :func:`route`, in the order of
    their first item, each at most :data:`MESSAGE_BYTES` of regions (a longer run is
    cut, in order, into several). ``staged``: an item's staging bytes
    (:func:`~reshard.planner.schedule.staging.task_staging`), when the caller has them."""
    runs: dict[tuple[Any, ...], list[list[tuple[int, X]]]] = {}
    size: dict[tuple[Any, ...], int] = {}
    for pos, item in enumerate(step):
        task = task_of(item)
        key, n = _route_and_size(task, tensor_of(task),
                                 None if staged is None else staged(item))
        if key is None:
            continue
        cut = runs.setdefault(key, [[]])
        if cut[-1] and size[key] + n > MESSAGE_BYTES:
            cut.append([])
            size[key] = 0
        cut[-1].append((pos, item))
        size[key] = size.get(key, 0) + n
    found = sorted((m for cut in runs.values() for m in cut if len(m) > 1),
                   key=lambda m: m[0][0])
    return [[item for _, item in m] for m in found]


def followers(tasks: Sequence[Task], tensors: Sequence[Conversion]) -> set[int]:
    """Indices of the plan's tasks that travel in another task's message (every member
    of a coalesced message but its first)."""
    out: set[int] = set()
    for run in step_runs(tasks):
        for m in messages(run, lambda r: r[1], lambda t: tensors[t.tensor]):
            out.update(i for i, _ in m[1:])
    return out


__all__ = ["MESSAGE_BYTES", "TASK_BYTES", "followers", "messages", "route"]

"""EstimateMany's work: each request checked and sized before any is planned, then
answered alone (a bad one gets its own error answer, the others their seconds).

A batch's *work* is counted in cells (:func:`reshard.service.budget.work`): each
request's fixed work (decoding it, its normal form, the planner's fixed cost), the most
devices one of its meshes or its cluster names (read off the message: :func:`raw_work`),
and, once decoded, the cells of its plan (:func:`size`). The servicer answers a batch of
at most :data:`~reshard.service.budget.INLINE_WORK` on its serving thread (about what
one inline Estimate may cost; :mod:`reshard.service.inline`) and sends a larger one to a
job worker (:func:`reshard.service.jobs.estimate_many`), which sizes every request first
(over ``--max-plan-cells`` together, the batch is refused before any is planned) and
then answers them in order until its time budget runs out: a batch stopped there
returns the answers it has (the rest are for another call).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reshard.cluster import Cluster
from reshard.errors import ReshardBaseError
from reshard.planner.estimates import CostCache, estimate
from reshard.planner.plan import plan_many
from reshard.planner.values.request import default_cluster, make_tensor_spec
from reshard.planner.values.strategy import Strategy
from reshard.service.budget import OverBudget, check_counts, request_cells, work
from reshard.service.convert import Request, request_from_pb
from reshard.service.status import details, error_name
from reshard.service.v1 import reshard_pb2 as pb

log = logging.getLogger("reshard.service")

Answer = tuple[float, str, str]
"""One request's answer: its seconds, and (when it failed) the error's text and class
name (empty otherwise), as ``EstimateResult`` carries them."""

@dataclass(frozen=True)
class Limits:
    """The server's budgets a batch is checked against (picklable: it travels to the
    job workers).

    Attributes:
        max_tensors: ``--max-tensors``, per request.
        max_devices: ``--max-devices``, per request.
        max_cells: ``--max-plan-cells``, for the batch's uncached requests together.
    """

    max_tensors: int
    max_devices: int
    max_cells: int


@dataclass(frozen=True)
class Sized:
    """A request decoded, checked and sized.

    Attributes:
        requests: its tensors, as :func:`reshard.plan_many` takes them.
        cluster: its cluster (the request's, else the server's, else one host of its
            devices).
        strategy: its strategy.
        work: its work in cells (module docstring).
        cells: its plan's cells.
    """

    requests: tuple[Request, ...]
    cluster: Cluster
    strategy: Strategy
    work: int
    cells: int


def error_answer(error: BaseException) -> Answer:
    """The answer of a request that failed with ``error`` (a reshard error; anything
    else is a bug, named as such)."""
    if isinstance(error, ReshardBaseError):
        text = str(error)
    else:
        text = f"internal error: {type(error).__name__}: {error}"
    return 0.0, details(text), sys.intern(error_name(error))


def raw_work(request: pb.PlanRequest, limits: Limits) -> int:
    """A request's work without its cells, read off its message (refused with
    :class:`OverBudget` over ``--max-tensors`` or ``--max-devices``)."""
    tensors, devices = check_counts("EstimateMany", request, limits.max_tensors,
                                    limits.max_devices)
    return work(tensors, devices)


def size(request: pb.PlanRequest, default: Cluster | None, limits: Limits) -> Sized:
    """The request decoded and checked as :func:`reshard.plan_many` would check it (a
    layout whose rank is not its shape's, a device outside the cluster, a partial sum of
    a type that cannot sum, ...: its error raised) and sized."""
    fixed = raw_work(request, limits)
    reqs, cluster, strategy = request_from_pb(request, default)
    if cluster is None:
        cluster = default_cluster(lay for r in reqs for lay in r[2:4])
    specs = [make_tensor_spec(*r[:4], cluster=cluster, cast=r[4]) for r in reqs]
    cells = request_cells([(t.shape, t.dtype, t.src, t.dst) for t in specs])
    return Sized(tuple(reqs), cluster, strategy, fixed + cells, cells)


def size_all(requests: Sequence[pb.PlanRequest], default: Cluster | None, limits: Limits,
             time_left: Callable[[], float | None] = lambda: None
             ) -> list[Sized | Answer] | None:
    """Each request sized, or its error answer; :class:`OverBudget` when the sized ones
    together pass ``limits.max_cells`` (before any is planned); None when
    ``time_left()`` ran out first."""
    out: list[Sized | Answer] = []
    cells = 0
    for r in requests:
        left = time_left()
        if left is not None and left <= 0:
            return None
        try:
            s = size(r, default, limits)
        except Exception as e:
            if isinstance(e, MemoryError):
                raise
            if not isinstance(e, ReshardBaseError):
                log.exception("internal error sizing an EstimateMany request")
            out.append(error_answer(e))
            continue
        cells += s.cells
        if cells > limits.max_cells:
            raise OverBudget(
                f"EstimateMany: the batch's uncached requests would plan about {cells}+ "
                f"cells (tasks) together, over the server's budget of {limits.max_cells} "
                f"(--max-plan-cells); send fewer requests per call")
        out.append(s)
    return out


def seconds_of(s: Sized, cache: CostCache) -> float:
    """The model's seconds of a sized request's plan (one tensor: through ``cache``,
    on its normal form; several: their plan's)."""
    if len(s.requests) == 1:
        shape, dtype, src, dst, cast = s.requests[0]
        return estimate(shape, dtype, src, dst, s.cluster, s.strategy,
                        cast=None if cast is None else cast.dtype,
                        scale=None if cast is None else cast.scale, cache=cache)
    return plan_many(list(s.requests), cluster=s.cluster, strategy=s.strategy).estimate()


def answer_one(s: Sized | Answer, cache: CostCache) -> Answer:
    """A sized request's answer (an answer already, as it is)."""
    if not isinstance(s, Sized):
        return s
    try:
        return seconds_of(s, cache), "", ""
    except Exception as e:
        if isinstance(e, MemoryError):
            raise
        if not isinstance(e, ReshardBaseError):
            log.exception("internal error in an EstimateMany request")
        return error_answer(e)


def answer_sized(sized: Sequence[Sized | Answer], cache: CostCache,
                 time_left: Callable[[], float | None]) -> list[Answer]:
    """The answers, in order, until ``time_left()`` (seconds, None: no limit) is 0: the
    first ones when it runs out."""
    out: list[Answer] = []
    for s in sized:
        left = time_left()
        if left is not None and left <= 0 and isinstance(s, Sized):
            break
        out.append(answer_one(s, cache))
    return out


def answer_within(requests: Sequence[bytes], default: Cluster | None, limits: Limits,
                  until: float | None) -> list[Answer]:
    """The answers of encoded requests, sized first, until ``until`` (a
    :func:`time.monotonic` time, the machine's clock: the server's; None: no limit):
    what a job worker runs (the first ones when the time runs out, none when it ran out
    while sizing)."""
    def time_left() -> float | None:
        return None if until is None else until - time.monotonic()
    sized = size_all([pb.PlanRequest.FromString(r) for r in requests], default, limits,
                     time_left)
    return [] if sized is None else answer_sized(sized, CostCache(), time_left)


__all__ = ["Answer", "Limits", "Sized", "answer_one",
           "answer_sized", "answer_within", "error_answer", "raw_work", "seconds_of",
           "size", "size_all"]

"""The ``reshard.v1.Reshard`` RPC handlers.

Plans are pure functions of the request, so the servicer keeps them: a repeated Plan,
PlanMany, Estimate or Execute request is answered from a cache (plans by request, costs
by request, encoded Plan replies, verified Execute plans by plan bytes; all least
recently used out first, bounded in bytes, keyed by the SHA-256 of the request's
canonical bytes, so unknown fields and huge requests cost a cache 32 bytes a key).
Every failure goes back as a status (see :mod:`reshard.service.status`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import google.protobuf
import grpc

import reshard
from reshard.cluster import Cluster
from reshard.errors import ReshardBaseError, ReshardError
from reshard.lru import LruCache
from reshard.planner.estimates import CostCache, estimate
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import plan_many
from reshard.planner.values.request import default_cluster, make_tensor_spec
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import FORMAT_VERSION, READABLE_FORMATS
from reshard.presets import preset_names
from reshard.service import jobs
from reshard.service.budget import (
    INLINE_CELLS,
    INLINE_DEVICES,
    INLINE_TASKS,
    INLINE_TENSORS,
    OverBudget,
    check_cells,
    check_counts,
    request_cells,
)
from reshard.service.convert import layout_to_pb, request_from_pb, split_rules
from reshard.service.options import ServeOptions
from reshard.service.plan_codec import (
    DEFAULT_CHUNK_TASKS,
    cost_to_pb,
    plan_chunks,
    plan_from_pb,
    plan_to_pb,
)
from reshard.service.runtime_host import RuntimeHost, deadline_expired
from reshard.service.status import ERROR_KEY, ServiceError, details, error_name, status_code
from reshard.service.v1 import reshard_pb2 as pb
from reshard.service.v1 import reshard_pb2_grpc as pb_grpc
from reshard.service.workpool import WorkPool

log = logging.getLogger("reshard.service")

API = pb.DESCRIPTOR.package
COST_CACHE_ENTRIES = 1 << 16
"""Costs kept for repeated Estimate requests (a 32-byte key and a few dozen bytes
each)."""

PLAN_TASK_BYTES = 400
"""Memory a plan's task holds in the server (measured: about 340 bytes a task of a
16,384-task plan), for weighing cached plans in bytes."""

PLAN_TENSOR_BYTES = 2048
"""Memory a plan's tensor (layouts, meshes) holds, for the same."""


def plan_bytes(plan: ReshardPlan) -> int:
    """What a plan costs a cache to keep, in bytes (an estimate from its size): its
    tasks and tensors, and its cluster (a request may name a huge cluster, or give it a
    huge name: the plan keeps both)."""
    return (PLAN_TASK_BYTES * len(plan.tasks) + PLAN_TENSOR_BYTES * len(plan.tensors)
            + plan.cluster.footprint + 4096)

ESTIMATE_RUN = 512
"""EstimateMany answers per streamed message."""

ANSWER_ENTRIES = 1 << 18
"""EstimateMany answers kept by their encoded request (a key of 32 bytes and a float
each, with any error's text)."""

R = TypeVar("R")


def abort(context: grpc.ServicerContext, error: BaseException) -> None:
    """End the call with the status ``error`` stands for (raises, as
    ``context.abort`` does)."""
    if isinstance(error, OverBudget):  # the service's refusal, wherever it was found
        error = ServiceError(str(error), grpc.StatusCode.RESOURCE_EXHAUSTED)
    if isinstance(error, ReshardBaseError):
        code = status_code(error, deadline_expired(context.time_remaining()))
        text = str(error)
    else:  # a bug: say what, keep the details in the server's log
        log.exception("internal error in a reshard.v1 call")
        code, text = grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: {error}"
    context.set_trailing_metadata(((ERROR_KEY, error_name(error)),))
    context.abort(code, details(text))


def _guarded(method: Callable[..., R]) -> Callable[..., R]:
    """A unary handler whose errors become statuses."""
    @functools.wraps(method)
    def handler(self: Any, request: Any, context: grpc.ServicerContext) -> R:
        try:
            return method(self, request, context)
        except Exception as e:  # every failure becomes a status
            abort(context, e)
            raise  # not reached: abort raises
    return handler


def canonical_key(message: Any, *ignored: str) -> bytes:
    """A cache key of a message: the SHA-256 of its deterministic bytes without unknown
    fields and without the fields named in ``ignored`` (they do not change the answer).
    32 bytes whatever the message's size, equal for messages that mean the same."""
    bare = type(message)()
    bare.CopyFrom(message)
    bare.DiscardUnknownFields()
    for name in ignored:
        bare.ClearField(name)
    return hashlib.sha256(bare.SerializeToString(deterministic=True)).digest()


def request_key(request: pb.PlanRequest) -> bytes:
    """The cache key of a request: :func:`canonical_key` without the fields that do not
    change the plan (include_cost, max_chunk_tasks)."""
    return canonical_key(request, "include_cost", "max_chunk_tasks")


class ReshardServicer(pb_grpc.ReshardServicer):
    """Handlers of the ``reshard.v1.Reshard`` service.

    Args:
        options: the server's options (default cluster, limits, cache sizes).
        host: the Runtime for Execute.
    """

    def __init__(self, options: ServeOptions, host: RuntimeHost) -> None:
        self.options = options
        self.host = host
        self.jobs = WorkPool(options.job_workers, options.job_memory_bytes)
        self.plans: LruCache[bytes, ReshardPlan] = LruCache(options.plan_cache_bytes,
                                                            weigh=plan_bytes)
        self.executable: LruCache[bytes, ReshardPlan] = LruCache(options.plan_cache_bytes,
                                                                 weigh=plan_bytes)
        self.costs: LruCache[bytes, bytes] = LruCache(COST_CACHE_ENTRIES)
        self.replies: LruCache[bytes, bytes] = LruCache(options.reply_cache_bytes, weigh=len)
        self.estimates = CostCache(options.reply_cache_bytes // 2)
        self.answers: LruCache[bytes, tuple[float, str, str]] = LruCache(
            ANSWER_ENTRIES)

    def _job(self, what: str, context: grpc.ServicerContext, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in a job worker, stopped at the caller's deadline, when the
        caller cancels, or at the server's cap (``job_timeout``); a budget the job found
        exceeded is RESOURCE_EXHAUSTED, as on the serving thread (:func:`abort`)."""
        return self.jobs.run(what, fn, *args, time_left=context.time_remaining,
                             active=context.is_active, cap=self.options.job_timeout)

    # ----- planning -------------------------------------------------------------------
    def _sized(self, request: pb.PlanRequest, what: str) -> tuple[list, Cluster, Strategy, int]:
        """The request's plan_many arguments and its cells (:mod:`reshard.service.budget`);
        refused over the budget."""
        reqs, cluster, strategy = request_from_pb(request, self.options.cluster)
        if cluster is None:
            cluster = default_cluster(lay for r in reqs for lay in r[2:4])
        specs = [make_tensor_spec(*r[:4], cluster=cluster, cast=r[4]) for r in reqs]
        cells = check_cells(what, [(t.shape, t.dtype, t.src, t.dst) for t in specs],
                            self.options.max_plan_cells)
        return reqs, cluster, strategy, cells

    def _inline(self, request: pb.PlanRequest, what: str) -> bool:
        """Whether the request may be sized on the serving thread (few tensors and
        devices: provably cheap), after its counts, read off the message, pass the
        server's budgets; otherwise a job worker sizes, plans and costs it."""
        tensors, devices = check_counts(what, request, self.options.max_tensors,
                                        self.options.max_devices)
        return tensors <= INLINE_TENSORS and devices <= INLINE_DEVICES

    def _inline_plan(self, request: pb.PlanRequest, what: str) -> Callable[[], ReshardPlan] | None:
        """What plans the request on the serving thread, where that is cheap (few
        tensors, devices and cells); None where a job worker must (sizing included)."""
        if not self._inline(request, what):
            return None
        reqs, cluster, strategy, cells = self._sized(request, what)
        if cells > INLINE_CELLS:
            return None
        return lambda: plan_many(reqs, cluster=cluster, strategy=strategy)

    def _plan(self, request: pb.PlanRequest, key: bytes, what: str,
              context: grpc.ServicerContext) -> ReshardPlan:
        def make() -> ReshardPlan:
            inline = self._inline_plan(request, what)
            if inline is not None:
                return inline()
            return self._job(what, context, jobs.plan, request.SerializeToString(),  # type: ignore[no-any-return]
                             self.options.cluster, self.options.max_plan_cells, what)
        return self.plans.get_or_make(key, make)

    def _cost(self, request: pb.PlanRequest, key: bytes,
              context: grpc.ServicerContext) -> bytes:
        """The encoded Cost of the request's plan (kept encoded: a few dozen bytes, where
        a decoded one holds about 550)."""
        def make() -> bytes:
            plan = self.plans.get(key)
            if plan is None:
                inline = self._inline_plan(request, "Estimate")
                if inline is not None:
                    plan = self.plans.get_or_make(key, inline)
                else:
                    return self._job(  # type: ignore[no-any-return]
                        "Estimate", context, jobs.cost, request.SerializeToString(),
                        self.options.cluster, self.options.max_plan_cells)
            return cost_to_pb(plan).SerializeToString()
        return self.costs.get_or_make(key, make)

    @_guarded
    def Plan(self, request: pb.PlanRequest, context: grpc.ServicerContext) -> bytes:
        """The PlanReply, encoded (replies are kept encoded: a decoded one holds about
        nine times its encoded size; :func:`reshard.service.admission.add_service`
        sends bytes as they are)."""
        key = request_key(request)
        reply_key = key + (b"+cost" if request.include_cost else b"")
        encoded = self.replies.get(reply_key)
        if encoded is None:
            plan = self._plan(request, key, "Plan", context)
            reply = pb.PlanReply()
            plan_to_pb(plan, into=reply.plan)
            if request.include_cost:
                reply.cost.ParseFromString(self._cost(request, key, context))
            encoded = reply.SerializeToString()
            del reply
            if len(encoded) > self.options.max_message_bytes:
                raise ServiceError(
                    f"the plan ({len(plan.tasks)} tasks) encodes to {len(encoded)} bytes, over "
                    f"the server's message limit of {self.options.max_message_bytes}; ask "
                    f"PlanMany, which streams it in chunks (Client.plan does so itself)",
                    grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.replies.put(reply_key, encoded)
        return encoded

    def PlanMany(self, request: pb.PlanRequest,
                 context: grpc.ServicerContext) -> Iterator[pb.PlanChunk]:
        try:
            key = request_key(request)
            plan = self._plan(request, key, "PlanMany", context)
            cost = (pb.Cost.FromString(self._cost(request, key, context))
                    if request.include_cost else None)
            per_chunk = min(request.max_chunk_tasks or DEFAULT_CHUNK_TASKS, DEFAULT_CHUNK_TASKS)
            limit = self.options.max_message_bytes
            chunks = plan_chunks(plan, per_chunk, limit // 2, cost)
            if chunks[0].ByteSize() > limit:
                raise ServiceError(
                    f"the plan's header ({len(plan.tensors)} tensors) encodes to "
                    f"{chunks[0].ByteSize()} bytes, over the server's message limit of "
                    f"{limit}; plan fewer tensors per request", grpc.StatusCode.RESOURCE_EXHAUSTED)
            yield from chunks
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            abort(context, e)

    @_guarded
    def Estimate(self, request: pb.PlanRequest, context: grpc.ServicerContext) -> bytes:
        return self._cost(request, request_key(request), context)

    def _estimate_one(self, request: pb.PlanRequest, key: bytes,
                      decoded: tuple[list, Cluster | None, Strategy],
                      context: grpc.ServicerContext) -> float:
        """One tensor's estimate (planned on the normal form, :mod:`reshard.planner.
        estimates`, through the server's cost cache); several tensors' (or a large
        plan's, in a job worker) as Estimate computes it. ``decoded``: the request's
        :func:`request_from_pb`, ``key`` its :func:`request_key`."""
        reqs, cluster, strategy = decoded
        if len(reqs) != 1 or not self._inline(request, "EstimateMany") or request_cells(
                [(r[0], r[1], r[2], r[3]) for r in reqs]) > INLINE_CELLS:
            return pb.Cost.FromString(self._cost(request, key, context)).seconds
        shape, dtype, src, dst, cast = reqs[0]
        return estimate(shape, dtype, src, dst, cluster, strategy,
                        cast=None if cast is None else cast.dtype,
                        scale=None if cast is None else cast.scale, cache=self.estimates)

    def EstimateMany(self, request: pb.EstimateManyRequest,
                     context: grpc.ServicerContext) -> Iterator[pb.EstimateManyReply]:
        """Each request's estimate, streamed in runs of :data:`ESTIMATE_RUN`; answered
        from the cache of encoded requests when asked before. The requests not cached
        are decoded and sized first: over the server's plan budget together, the batch
        is refused before any is planned."""
        try:
            keys = [request_key(r) for r in request.requests]
            decoded: dict[bytes, tuple[list, Cluster | None, Strategy] | ReshardBaseError] = {}
            cells = 0
            for i, k in enumerate(keys):
                if k in decoded or self.answers.get(k) is not None:
                    continue
                try:
                    got = decoded[k] = request_from_pb(request.requests[i],
                                                       self.options.cluster)
                except ReshardBaseError as e:
                    decoded[k] = e  # answered below with its error
                    continue
                cells += request_cells([(r[0], r[1], r[2], r[3]) for r in got[0]])
                if cells > self.options.max_plan_cells:
                    raise ServiceError(
                        f"EstimateMany: the batch's {len(decoded)}+ uncached requests "
                        f"would plan about {cells}+ cells (tasks), over the server's budget "
                        f"of {self.options.max_plan_cells} (--max-plan-cells); send fewer "
                        f"requests per call", grpc.StatusCode.RESOURCE_EXHAUSTED)
            run: list[pb.EstimateResult] = []
            for i, k in enumerate(keys):
                answer = self.answers.get(k)
                if answer is None:
                    if deadline_expired(context.time_remaining()):
                        raise ServiceError(
                            f"EstimateMany: the deadline passed after {i} of "
                            f"{len(keys)} requests", grpc.StatusCode.DEADLINE_EXCEEDED)
                    try:
                        known = decoded.get(k)  # none: its answer left the cache since
                        if known is None:
                            known = request_from_pb(request.requests[i], self.options.cluster)
                        if isinstance(known, ReshardBaseError):
                            raise known
                        answer = (self._estimate_one(request.requests[i], k, known, context),
                                  "", "")
                    except ReshardBaseError as e:
                        answer = (0.0, details(str(e)), error_name(e))
                    self.answers.put(k, answer)
                run.append(pb.EstimateResult(index=i, seconds=answer[0], error=answer[1],
                                             error_type=answer[2]))
                if len(run) == ESTIMATE_RUN:
                    yield pb.EstimateManyReply(results=run)
                    run = []
            if run or not keys:
                yield pb.EstimateManyReply(results=run)
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            abort(context, e)

    # ----- execution ------------------------------------------------------------------
    def _executable(self, plan: pb.Plan, context: grpc.ServicerContext) -> ReshardPlan:
        def make() -> ReshardPlan:
            tasks = len(plan.tasks)
            if tasks > self.options.max_plan_cells:
                raise ServiceError(
                    f"Execute: the plan has {tasks} tasks, over the server's budget of "
                    f"{self.options.max_plan_cells} (--max-plan-cells); split it",
                    grpc.StatusCode.RESOURCE_EXHAUSTED)
            if tasks <= INLINE_TASKS:
                return plan_from_pb(plan, verify=True)
            return self._job("Execute", context, jobs.verify,  # type: ignore[no-any-return]
                             plan.SerializeToString())
        return self.executable.get_or_make(canonical_key(plan), make)

    @_guarded
    def Execute(self, request: pb.ExecuteRequest,
                context: grpc.ServicerContext) -> pb.ExecuteReply:
        if not request.HasField("plan"):
            raise ReshardError("ExecuteRequest has no plan; set ExecuteRequest.plan (the "
                               "Plan RPC's answer)")
        plan = self._executable(request.plan, context)
        inputs: list[str | bytes] = []
        for i, ref in enumerate(request.inputs):
            kind = ref.WhichOneof("kind")
            if kind is None:
                raise ReshardError(f"input {i} is empty; set its handle or its data")
            inputs.append(ref.handle if kind == "handle" else ref.data)
        start = time.perf_counter()
        outs = self.host.execute(plan, inputs, fetch=request.fetch, keep=request.keep,
                                 free_inputs=request.free_inputs,
                                 time_left=context.time_remaining)
        reply = pb.ExecuteReply(seconds=time.perf_counter() - start)
        for o in outs:
            reply.outputs.add(handle=o.handle, shape=o.tensor.shape, dtype=o.tensor.dtype,
                              layout=layout_to_pb(o.tensor.dst), data=o.data or b"")
        return reply

    @_guarded
    def Free(self, request: pb.FreeRequest, context: grpc.ServicerContext) -> pb.FreeReply:
        return pb.FreeReply(freed=self.host.free(list(request.handles)))

    @_guarded
    def GetVersion(self, request: pb.VersionRequest,
                   context: grpc.ServicerContext) -> pb.VersionReply:
        o = self.options
        return pb.VersionReply(
            reshard_version=reshard.__version__, api=API, plan_format=FORMAT_VERSION,
            readable_formats=READABLE_FORMATS,
            backend=o.backend or "", strategies=[s.value for s in Strategy],
            presets=preset_names(), split_rules=split_rules(),
            max_message_bytes=o.max_message_bytes, max_inline_bytes=o.max_inline_bytes,
            grpc_version=grpc.__version__, protobuf_version=google.protobuf.__version__)

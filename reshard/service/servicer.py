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
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import google.protobuf
import grpc

import reshard
from reshard.cluster import Cluster
from reshard.errors import ReshardBaseError, ReshardError
from reshard.lru import LruCache
from reshard.planner.estimates import CostCache
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import plan_many
from reshard.planner.values.request import default_cluster, make_tensor_spec
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import FORMAT_VERSION, READABLE_FORMATS
from reshard.presets import preset_names
from reshard.service import jobs, searches, wire
from reshard.service.budget import (
    INLINE_CELLS,
    INLINE_DEVICES,
    INLINE_TASKS,
    INLINE_TENSORS,
    INLINE_WORK,
    REQUEST_WORK,
    OverBudget,
    check_cells,
    check_counts,
    check_estimate_many_wire,
    check_estimates,
    check_plan_request_wire,
    check_search_wire,
    work,
)
from reshard.service.convert import layout_to_pb, request_from_pb, split_rules
from reshard.service.estimates import (
    Answer,
    Limits,
    Sized,
    answer_sized,
    raw_work,
    size_all,
)
from reshard.service.inline import InlineSlots
from reshard.service.options import ServeOptions
from reshard.service.plan_codec import (
    DEFAULT_CHUNK_TASKS,
    cost_to_pb,
    plan_chunks,
    plan_from_pb,
    plan_to_pb,
)
from reshard.service.runtime_host import DEADLINE_MARGIN, RuntimeHost, deadline_expired
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

ANSWER_ENTRY_BYTES = 320
"""Memory one cached EstimateMany answer holds besides its strings: its 32-byte key, its
tuples, float and weight, the cache's slot (measured with tracemalloc: 305-315 bytes;
tests/unit/test_service_answers.py)."""

EARLY_SAMPLE = 16
"""Requests of a batch looked up before refusing it while the job workers are busy."""

EARLY_BYTES = 64 << 10
"""EstimateMany calls of at most this many bytes are never refused early (a few
requests: the handler decides); nor are those whose sampled requests are larger."""

JOB_ANSWER_MARGIN = 1.0
"""Seconds (at most a quarter of the time it has) an EstimateMany job keeps to send the
answers it has back before the call's deadline or the server's cap."""

SEARCH_DIGESTS = 4096
"""Searches answered whose request bytes are remembered (their SHA-256), so that they
pass the refusal of Searches while the job workers are busy (then answered from the
cache)."""

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


def admitted_key(request: pb.PlanRequest) -> bytes:
    """:func:`request_key` of a request whose unknown fields were dropped on arrival
    (:mod:`reshard.service.admission` does so, nested messages included): the same key,
    without copying the message (an EstimateMany's thousands of keys)."""
    if request.include_cost or request.max_chunk_tasks:
        return request_key(request)
    return hashlib.sha256(request.SerializeToString(deterministic=True)).digest()


def _runs(keys: list[bytes], answers: dict[bytes, Answer]) -> Iterator[pb.EstimateManyReply]:
    """The answers of ``keys`` (those known) in order, in runs of :data:`ESTIMATE_RUN`
    (one empty reply for no keys)."""
    run: list[pb.EstimateResult] = []
    for i, k in enumerate(keys):
        answer = answers.get(k)
        if answer is None:
            continue
        run.append(pb.EstimateResult(index=i, seconds=answer[0], error=answer[1],
                                     error_type=answer[2]))
        if len(run) == ESTIMATE_RUN:
            yield pb.EstimateManyReply(results=run)
            run = []
    if run or not keys:
        yield pb.EstimateManyReply(results=run)


def answer_bytes(answer: Answer) -> int:
    """What an answer costs the answers cache, in bytes: its entry (key, tuples, float,
    the cache's own slot: :data:`ANSWER_ENTRY_BYTES`) and its strings as Python holds
    them (an error's text: up to 4 KB, 4 bytes a character outside Latin-1)."""
    return ANSWER_ENTRY_BYTES + sys.getsizeof(answer[1]) + sys.getsizeof(answer[2])


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
        self.answers: LruCache[bytes, Answer] = LruCache(options.answer_cache_bytes,
                                                         weigh=answer_bytes)
        self.searches: LruCache[bytes, bytes] = LruCache(options.search_cache_bytes, weigh=len)
        self.search_digests: LruCache[bytes, bytes] = LruCache(SEARCH_DIGESTS)
        self.limits = Limits(options.max_tensors, options.max_devices, options.max_plan_cells)
        self.slots = InlineSlots()

    def wire_checks(self) -> dict[str, Callable[[bytes], None]]:
        """What each method's request bytes are checked by before they are parsed (the
        counts ``--max-tensors`` and ``--max-estimates`` limit:
        :mod:`reshard.service.wire`)."""
        o = self.options
        checks: dict[str, Callable[[bytes], None]] = {
            what: functools.partial(check_plan_request_wire, what, max_tensors=o.max_tensors)
            for what in ("Plan", "PlanMany", "Estimate")}
        checks["EstimateMany"] = self._check_estimate_many
        checks["Search"] = self._check_search
        return checks

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

    def _inline(self, request: pb.PlanRequest, what: str) -> tuple[int, int] | None:
        """The request's ``(tensors, devices)`` where it may be sized on the serving
        thread (few tensors and devices: provably cheap), after its counts, read off the
        message, pass the server's budgets; None where a job worker sizes, plans and
        costs it."""
        tensors, devices = check_counts(what, request, self.options.max_tensors,
                                        self.options.max_devices)
        if tensors <= INLINE_TENSORS and devices <= INLINE_DEVICES:
            return tensors, devices
        return None

    def _inline_plan(self, request: pb.PlanRequest, what: str
                     ) -> tuple[Callable[[], ReshardPlan], int] | None:
        """What plans the request on the serving thread, where that is cheap (few
        tensors, devices and cells), and its work (:func:`reshard.service.budget.work`);
        None where a job worker must (sizing included)."""
        counts = self._inline(request, what)
        if counts is None:
            return None
        reqs, cluster, strategy, cells = self._sized(request, what)
        if cells > INLINE_CELLS:
            return None
        return lambda: plan_many(reqs, cluster=cluster, strategy=strategy), work(*counts, cells)

    def _plan(self, request: pb.PlanRequest, key: bytes, what: str,
              context: grpc.ServicerContext) -> ReshardPlan:
        def make() -> ReshardPlan:
            inline = self._inline_plan(request, what)
            if inline is not None:
                with self.slots.hold(inline[1]) as here:
                    if here:
                        return inline[0]()
            return self._job(what, context, jobs.plan, request.SerializeToString(),  # type: ignore[no-any-return]
                             self.options.cluster, self.options.max_plan_cells, what)
        return self.plans.get_or_make(key, make)

    def _cost(self, request: pb.PlanRequest, key: bytes,
              context: grpc.ServicerContext) -> bytes:
        """The encoded Cost of the request's plan (kept encoded: a few dozen bytes, where
        a decoded one holds about 550): on the serving thread where the request is cheap
        and (beyond light work) an inline slot is free, else in a job worker."""
        def make() -> bytes:
            plan = self.plans.get(key)
            if plan is not None:
                return cost_to_pb(plan).SerializeToString()
            inline = self._inline_plan(request, "Estimate")
            if inline is not None:
                with self.slots.hold(inline[1]) as here:
                    if here:
                        return cost_to_pb(self.plans.get_or_make(key, inline[0])
                                          ).SerializeToString()
            return self._job(  # type: ignore[no-any-return]
                "Estimate", context, jobs.cost, request.SerializeToString(),
                self.options.cluster, self.options.max_plan_cells)
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

    def _job_until(self, context: grpc.ServicerContext) -> float:
        """When (:func:`time.monotonic`) a job stops answering and returns what it has:
        the caller's deadline or the server's cap (``job_timeout``), less a margin to
        send the answers back in time (the worker is killed at the deadline or the cap
        itself)."""
        left = context.time_remaining()
        hard = self.options.job_timeout if left is None else min(left, self.options.job_timeout)
        return time.monotonic() + max(0.0, hard - min(JOB_ANSWER_MARGIN, hard / 4))

    def _answer_inline(self, requests: list[pb.PlanRequest],
                       context: grpc.ServicerContext) -> list[Answer] | None:
        """The answers, worked out on the serving thread where the requests' work
        (:mod:`reshard.service.estimates`) is at most :data:`INLINE_WORK` (read off the
        messages first, then from the decoded layouts) and, beyond light work, an inline
        slot is free (:mod:`reshard.service.inline`); None where not."""
        work = 0
        for r in requests:
            try:
                work += raw_work(r, self.limits)
            except OverBudget:
                work += REQUEST_WORK  # answered with its error when sized
            if work > INLINE_WORK:
                return None
        def time_left() -> float | None:
            left = context.time_remaining()
            return None if left is None else left - DEADLINE_MARGIN

        sized = size_all(requests, self.options.cluster, self.limits, time_left)
        if sized is None:
            return []
        total = sum(s.work for s in sized if isinstance(s, Sized))
        if total > INLINE_WORK:
            return None
        with self.slots.hold(total) as here:
            return answer_sized(sized, self.estimates, time_left) if here else None

    def _answer(self, requests: list[pb.PlanRequest],
                context: grpc.ServicerContext) -> list[Answer]:
        """The answers of uncached requests, in order: on the serving thread when their
        work is small, else in a job worker (refused when every worker is busy), the
        first ones only when the time ran out."""
        if len(requests) * REQUEST_WORK <= INLINE_WORK:
            inline = self._answer_inline(requests, context)
            if inline is not None:
                return inline
        return self._job(  # type: ignore[no-any-return]
            "EstimateMany", context, jobs.estimate_many,
            [r.SerializeToString() for r in requests], self.options.cluster, self.limits,
            self._job_until(context))

    def _check_estimate_many(self, raw: bytes) -> None:
        """An EstimateMany's bytes, before they are parsed: while every job worker is
        busy, a batch whose first :data:`EARLY_SAMPLE` requests (parsed alone) say its
        uncached work is over the serving thread's is refused busy, the rest never
        scanned or parsed (a flood of such batches then costs the server little); then
        its counts within the budgets (:func:`check_estimate_many_wire`)."""
        self._refuse_early(raw)
        o = self.options
        check_estimate_many_wire(raw, o.max_estimates, o.max_tensors)

    def _refuse_early(self, raw: bytes) -> None:
        """Refuse an EstimateMany's bytes while the job workers are busy (see
        :meth:`_check_estimate_many`); a sample of small requests only."""
        if len(raw) <= EARLY_BYTES or self.jobs.free():
            return
        ranges = wire.first_entries(raw, 1, EARLY_SAMPLE)
        if not ranges or any(stop - start > EARLY_BYTES for start, stop in ranges):
            return
        n = len(raw) * len(ranges) // ranges[-1][1]  # about, from the sample's sizes
        if n * REQUEST_WORK <= INLINE_WORK:
            return
        misses = 0
        for start, stop in ranges:
            try:
                r = pb.PlanRequest.FromString(raw[start:stop])
            except Exception:  # noqa: BLE001 - not a request: the parser will say so
                return
            r.DiscardUnknownFields()
            misses += self.answers.get(admitted_key(r)) is None
        if misses * n * REQUEST_WORK > INLINE_WORK * len(ranges):
            raise self.jobs.busy_error("EstimateMany")

    def EstimateMany(self, request: pb.EstimateManyRequest,
                     context: grpc.ServicerContext) -> Iterator[pb.EstimateManyReply]:
        """Each request's estimate, streamed in order in runs of :data:`ESTIMATE_RUN`;
        answered from the cache of encoded requests when asked before. Over
        ``--max-estimates`` requests the call is refused at once. The uncached ones
        are checked and sized before any is planned (:mod:`reshard.service.estimates`):
        each bad one gets its own error answer; over the server's plan budget together
        the batch is refused; a small batch is answered on the serving thread, a larger
        one in a job worker (refused when all are busy) until the deadline or the
        server's cap: the answers it has are streamed, then the call ends
        DEADLINE_EXCEEDED."""
        try:
            check_estimates(len(request.requests), self.options.max_estimates)
            keys = [admitted_key(r) for r in request.requests]
            got: dict[bytes, Answer] = {}
            todo: dict[bytes, pb.PlanRequest] = {}
            for k, r in zip(keys, request.requests, strict=True):
                if k not in got and k not in todo:
                    answer = self.answers.get(k)
                    if answer is None:
                        todo[k] = r
                    else:
                        got[k] = answer
            answered = self._answer(list(todo.values()), context) if todo else []
            for k, (seconds, error, kind) in zip(todo, answered, strict=False):
                got[k] = (seconds, error, sys.intern(kind))
                self.answers.put(k, got[k])
            yield from _runs(keys, got)
            if len(answered) < len(todo):
                done = sum(k in got for k in keys)
                raise ServiceError(
                    f"EstimateMany: answered {done} of {len(keys)} requests (streamed before this) "
                    f"before the call's deadline or the server's cap of "
                    f"{self.options.job_timeout:g} s (--job-timeout); they are cached now: "
                    f"ask the rest again, or fewer per call", grpc.StatusCode.DEADLINE_EXCEEDED)
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            abort(context, e)

    # ----- search ---------------------------------------------------------------------
    def _check_search(self, raw: bytes) -> None:
        """A Search's bytes, before they are parsed: while every job worker is busy, a
        Search whose bytes are not those of one answered before (:data:`SEARCH_DIGESTS`)
        is refused busy, unscanned and unparsed (a search always takes a worker: a flood
        of them then costs the server little); then its counts within the budget
        (:func:`check_search_wire`)."""
        if not self.jobs.free() and \
                self.search_digests.get(hashlib.sha256(raw).digest()) is None:
            raise self.jobs.busy_error("Search")
        check_search_wire(raw, self.options.max_search_candidates)

    @_guarded
    def Search(self, request: pb.SearchRequest, context: grpc.ServicerContext) -> bytes:
        """The SearchReply, encoded (:mod:`reshard.service.searches`): answered from the
        cache of complete answers (keyed by the canonical request without its
        ``time_limit``), else sized off the message (refused over ``--max-devices`` or
        ``--max-search-cells``) and searched in a job worker (refused while every one is
        busy) until the caller's deadline or ``--job-timeout``, less a margin."""
        key = canonical_key(request, "time_limit")
        encoded = self.searches.get(key)
        if encoded is not None:
            return encoded
        o = self.options
        searches.check_search(request, o.cluster, o.max_devices, o.max_search_cells)
        until = searches.until(context.time_remaining(), o.job_timeout, searches.MARGIN)
        raw = request.SerializeToString()  # what a client sends, mostly: its digest below
        encoded, complete = self._job("Search", context, jobs.search, raw, o.cluster, until,
                                      o.job_timeout)
        if len(encoded) > o.max_message_bytes:
            raise ServiceError(f"Search: the answer encodes to {len(encoded)} bytes, over the "
                               f"server's message limit of {o.max_message_bytes}; search "
                               f"fewer layers per request", grpc.StatusCode.RESOURCE_EXHAUSTED)
        if complete:
            self.searches.put(key, encoded)
            self.search_digests.put(hashlib.sha256(raw).digest(), key)
        return encoded  # type: ignore[no-any-return]

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

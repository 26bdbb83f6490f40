"""Client: the Python API of a remote ``reshard serve``.

Example::

    from reshard.service import Client

    with Client("127.0.0.1:50051") as c:
        p = c.plan((1024, 64), "float32", src, dst, cluster=cluster)   # a ReshardPlan
        seconds, bound = c.estimate((1024, 64), "float32", src, dst, cluster=cluster)

A server-side error is raised as the same :class:`reshard.ReshardError` subclass with
the same message; failures of the service itself (unreachable, refused token, size
limits) raise :class:`ServiceError` with the gRPC status code.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from reshard.cluster import Cluster
from reshard.dtypes import Cast, parse_dtype
from reshard.errors import ReshardBaseError, ReshardError
from reshard.layout import Layout, check_shape
from reshard.lru import LruCache
from reshard.planner.estimates import EstimateError
from reshard.planner.estimates import request_parts as estimate_parts
from reshard.planner.ir import ReshardPlan
from reshard.planner.values.request import request_parts
from reshard.planner.values.strategy import Strategy
from reshard.service.auth import bearer
from reshard.service.convert import SERVICE_NAME, encode_value, layout_from_pb, request_to_pb
from reshard.service.options import DEFAULT_MAX_MESSAGE
from reshard.service.plan_codec import merge_chunks, plan_from_pb, plan_to_pb
from reshard.service.status import ERROR_CLASSES, ServiceError, raise_rpc_error, rpc_error
from reshard.service.v1 import reshard_pb2 as pb
from reshard.service.v1 import reshard_pb2_grpc as pb_grpc

if TYPE_CHECKING:  # the search (and the pipeline it simulates) load when first asked
    from reshard.search import Graph, Layer
    from reshard.service.search_codec import SearchResult


@dataclass(frozen=True)
class RemoteArray:
    """An Execute output: its handle on the server (empty unless kept), what it is, and
    its value when fetched.

    Attributes:
        handle: pass it as an input of a later :meth:`Client.execute`, or to
            :meth:`Client.free`.
        shape: global shape.
        dtype: dtype name.
        layout: its layout on the server's Runtime.
        data: the global array when fetched, else None.
    """

    handle: str
    shape: tuple[int, ...]
    dtype: str
    layout: Layout
    data: np.ndarray | None = field(default=None, compare=False, repr=False)


def _pem(value: bytes | str | None) -> bytes | None:
    """PEM bytes, given as bytes or a file path."""
    if value is None or isinstance(value, bytes):
        return value
    return pathlib.Path(value).read_bytes()


Request = tuple[Sequence[int], Any, Layout, Layout]

ENCODED_VALUES = 256
"""Layouts and clusters a Client keeps encoded (callers ask about the same ones often)."""


class Client:
    """A connection to a reshard server.

    Args:
        address: ``host:port`` of the server.
        token: the server's token, sent as ``authorization: Bearer <token>``.
        root_certificates: CA certificate(s) (PEM bytes or a file path) to verify a TLS
            server; set it (or ``tls=True`` for the system's CAs) to use TLS.
        certificate_chain: this client's certificate (mutual TLS).
        private_key: this client's key (mutual TLS).
        tls: use TLS even without ``root_certificates`` (the system's CAs).
        timeout: default deadline of each call, in seconds (None: no deadline). For
            Execute the deadline also bounds the server's Runtime (see docs/service.md).
        max_message_bytes: largest message sent or received.
        verify: verify plans received before returning them (as ``from_json`` does).
        plan_cache_tasks: plans kept by the bytes of their answer (in tasks), so that a
            plan asked for again is not decoded and verified again.
    """

    def __init__(self, address: str, *, token: str | None = None,
                 root_certificates: bytes | str | None = None,
                 certificate_chain: bytes | str | None = None,
                 private_key: bytes | str | None = None, tls: bool = False,
                 timeout: float | None = 60.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE, verify: bool = True,
                 plan_cache_tasks: int = 1 << 16) -> None:
        self.address = address
        self.timeout = timeout
        self.verify = verify
        self._metadata = bearer(token) if token is not None else ()
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]
        if tls or root_certificates is not None:
            creds = grpc.ssl_channel_credentials(_pem(root_certificates), _pem(private_key),
                                                 _pem(certificate_chain))
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = pb_grpc.ReshardStub(self._channel)
        # Plan answers arrive as bytes: the cache key of the plan they decode to
        self._plan_bytes = self._channel.unary_unary(
            f"/{SERVICE_NAME}/Plan", request_serializer=pb.PlanRequest.SerializeToString)
        self._plans: LruCache[bytes, ReshardPlan] = LruCache(
            plan_cache_tasks, weigh=lambda p: len(p.tasks) + 1)
        self._encoded: LruCache[Layout | Cluster, Any] = LruCache(ENCODED_VALUES)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    # ----- lifecycle ------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Any, request: Any, timeout: float | None) -> Any:
        try:
            return method(request, timeout=self.timeout if timeout is None else timeout,
                          metadata=self._metadata)
        except grpc.RpcError as e:
            raise_rpc_error(e)

    # ----- planning -------------------------------------------------------------------
    def _encode(self, value: Layout | Cluster) -> Any:
        return self._encoded.get_or_make(value, lambda: encode_value(value))

    def _request(self, requests: Iterable[Request], cluster: Cluster | None,
                 strategy: str | Strategy, cast: Cast | None = None) -> pb.PlanRequest:
        reqs = []
        for r in requests:
            shape, dtype, src, dst, own = request_parts(r)
            for name, lay in (("source", src), ("destination", dst)):
                if not isinstance(lay, Layout):
                    raise ReshardError(f"{name} layout must be a reshard.Layout, got "
                                       f"{type(lay).__name__}")
            reqs.append((check_shape(shape), parse_dtype(dtype).name, src, dst,
                         cast if own is None else own))
        if cluster is not None and not isinstance(cluster, Cluster):
            raise ReshardError(f"cluster must be a reshard.Cluster, got {type(cluster).__name__}")
        return request_to_pb(reqs, cluster, strategy, encode=self._encode)

    def plan(self, shape: Sequence[int], dtype: Any, src: Layout, dst: Layout,
             cluster: Cluster | None = None, strategy: str | Strategy = Strategy.BROADCAST,
             *, cast: Any = None, scale: Any = None,
             timeout: float | None = None) -> ReshardPlan:
        """The server's :func:`reshard.plan` (``cluster`` None: the server's default;
        ``cast`` / ``scale`` as there).

        A plan over the message limit comes through PlanMany's stream instead.
        """
        request = self._request([(shape, dtype, src, dst)], cluster, strategy,
                                Cast.parse(cast, scale))
        try:
            answer = self._call(self._plan_bytes, request, timeout)
        except ServiceError as e:
            if e.code is not grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            return self._plan_stream(request, timeout)
        return self._plans.get_or_make(answer, lambda: plan_from_pb(
            pb.PlanReply.FromString(answer).plan, verify=self.verify))

    def plan_many(self, requests: Iterable[Request], cluster: Cluster | None = None,
                  strategy: str | Strategy = Strategy.BROADCAST, *, cast: Any = None,
                  scale: Any = None, timeout: float | None = None) -> ReshardPlan:
        """The server's :func:`reshard.plan_many`, streamed in chunks."""
        return self._plan_stream(self._request(requests, cluster, strategy,
                                               Cast.parse(cast, scale)), timeout)

    def _plan_stream(self, request: pb.PlanRequest, timeout: float | None) -> ReshardPlan:
        try:
            stream = self._stub.PlanMany(request,
                                         timeout=self.timeout if timeout is None else timeout,
                                         metadata=self._metadata)
            plan, _ = merge_chunks(stream)
        except grpc.RpcError as e:
            raise_rpc_error(e)
        return plan_from_pb(plan, verify=self.verify)

    def estimate(self, shape: Sequence[int], dtype: Any, src: Layout, dst: Layout,
                 cluster: Cluster | None = None, strategy: str | Strategy = Strategy.BROADCAST,
                 *, cast: Any = None, scale: Any = None,
                 timeout: float | None = None) -> tuple[float, float]:
        """``(plan.estimate(), plan.lower_bound())`` of the plan :meth:`plan` would return,
        without sending the plan."""
        request = self._request([(shape, dtype, src, dst)], cluster, strategy,
                                Cast.parse(cast, scale))
        cost = self._call(self._stub.Estimate, request, timeout)
        return cost.seconds, cost.lower_bound_seconds

    def estimate_many(self, requests: Iterable[Sequence[Any]],
                      strategy: str | Strategy = Strategy.BROADCAST, *, cast: Any = None,
                      scale: Any = None, timeout: float | None = None) -> list[float]:
        """The server's :func:`reshard.estimate_many`: each request ``(shape, dtype, src,
        dst, cluster[, strategy])`` (a cluster of None: the server's default) answered
        in order, streamed; a bad request fails alone (:class:`reshard.EstimateError`
        carries the others' estimates and each failure's position and error). A call the
        server stopped at its deadline or its cap after some answers raises
        EstimateError too: those answers, and for each request left the call's
        :class:`ServiceError` (``DEADLINE_EXCEEDED``; the server caches what it
        answered, so asking the batch again goes on where it stopped)."""
        the_cast = Cast.parse(cast, scale)
        message = pb.EstimateManyRequest()
        local: dict[int, ReshardBaseError] = {}
        for i, r in enumerate(requests):
            try:
                shape, dtype, src, dst, cluster, strat = estimate_parts(r, strategy)
                message.requests.append(self._request([(shape, dtype, src, dst)], cluster,
                                                      strat, the_cast))
            except ReshardBaseError as e:  # refused here; the others still go
                local[i] = e
                message.requests.append(pb.PlanRequest())
        out = [math.nan] * len(message.requests)
        failures: dict[int, ReshardBaseError] = {}
        answered: set[int] = set()
        try:
            for reply in self._stub.EstimateMany(
                    message, timeout=self.timeout if timeout is None else timeout,
                    metadata=self._metadata):
                for res in reply.results:
                    answered.add(res.index)
                    if res.error:
                        cls = ERROR_CLASSES.get(res.error_type, ReshardError)
                        failures[res.index] = cls(res.error)
                    else:
                        out[res.index] = res.seconds
        except grpc.RpcError as e:
            if not answered:
                raise_rpc_error(e)
            stopped = rpc_error(e)  # after some answers: the rest fail with it
            failures.update((i, stopped) for i in range(len(out)) if i not in answered)
        failures.update(local)
        if failures:
            for i in failures:
                out[i] = math.nan
            raise EstimateError(out, dict(sorted(failures.items())))
        return out

    # ----- search ---------------------------------------------------------------------
    def search(self, model: Sequence[Layer] | Graph, cluster: Cluster | None,
               microbatches: int, *, timeout: float | None = None,
               **options: Any) -> SearchResult:
        """The server's :func:`reshard.search.search_chain` of ``model`` (a sequence of
        layers), or :func:`reshard.search.search_graph` (a :class:`reshard.search.Graph`).

        Args:
            model: the layers, or a graph.
            cluster: a regular cluster (None: the server's ``--cluster``).
            microbatches: B.
            timeout: the call's deadline (default: the Client's); the server stops the
                search there, less a margin to answer (DEADLINE_EXCEEDED).
            options: the search's own keyword arguments, as in process: ``schedule``,
                ``memory_limit``, ``block``, ``rerank``, ``time_limit``, ``chunks``
                (virtual stages: pieces per submesh under interleaved 1F1B); a chain's
                ``moves``; a graph's ``method``, ``few``, ``steps``, ``seed``, ``beta``
                (unset: the search's defaults). ``cache`` is the server's own.

        Returns:
            SearchResult: ``choice`` equal to the in-process search's, and the
            baselines' own choices (``beats``: those it is faster than).

        Raises:
            SearchError: bad input, as the search itself names it (INVALID_ARGUMENT).
            ServiceError: over the server's budgets (RESOURCE_EXHAUSTED), stopped at
                the deadline, the server's cap or ``time_limit`` (DEADLINE_EXCEEDED).
        """
        from reshard.service.search_codec import search_request

        return self._search(search_request(model, cluster, microbatches,
                                           encode=self._encode, **options), timeout)

    def search_replicated(self, model: Sequence[Layer], cluster: Cluster | None,
                          microbatches: int, *, replicas: Sequence[int] | None = None,
                          timeout: float | None = None, **options: Any) -> SearchResult:
        """The server's :func:`reshard.search.search_replicated`: the data-parallel
        degree among ``replicas`` (None: every divisor of the host count) and one
        replica's stages; ``SearchResult.replicated`` equals the in-process answer.
        ``model`` is the layers (a function building them runs only in process);
        ``options`` as :meth:`search` takes a chain's (``schedule``, ``memory_limit``,
        ``block``, ``rerank``, ``time_limit``)."""
        from reshard.service.search_codec import search_request

        return self._search(search_request(
            model, cluster, microbatches, replicas=True if replicas is None else replicas,
            encode=self._encode, **options), timeout)

    def _search(self, request: pb.SearchRequest, timeout: float | None) -> SearchResult:
        from reshard.service.search_codec import reply_from_pb

        return reply_from_pb(self._call(self._stub.Search, request, timeout))

    # ----- execution ------------------------------------------------------------------
    def execute(self, plan: ReshardPlan, inputs: Sequence[np.ndarray | RemoteArray | str], *,
                fetch: bool = True, keep: bool = False, free_inputs: bool = False,
                timeout: float | None = None) -> list[RemoteArray]:
        """Run ``plan`` on the server's Runtime.

        Args:
            plan: the plan (verified by the server before any byte moves).
            inputs: one per input tensor of the plan (``plan.inputs``: every tensor but
                a scaled cast's amax and scales): a global array (sent inline, placed on
                the tensor's source layout) or a kept array / its handle.
            fetch: return the outputs' values (``RemoteArray.data``).
            keep: keep the outputs on the server (their handles are returned).
            free_inputs: free the input handles afterwards.
            timeout: the call's deadline, which also bounds the server's Runtime.
        """
        request = pb.ExecuteRequest(fetch=fetch, keep=keep, free_inputs=free_inputs)
        plan_to_pb(plan, into=request.plan)
        given = plan.inputs
        for i, x in enumerate(inputs):
            if isinstance(x, RemoteArray):
                request.inputs.add(handle=x.handle)
            elif isinstance(x, str):
                request.inputs.add(handle=x)
            else:
                if i >= len(given):
                    raise ReshardError(f"the plan moves {len(given)} input tensors, got "
                                       f"{len(inputs)} inputs; give one per input tensor")
                dt = parse_dtype(plan.tensors[given[i]].dtype).newbyteorder("<")
                request.inputs.add(data=np.ascontiguousarray(x, dtype=dt).tobytes())
        reply = self._call(self._stub.Execute, request, timeout)
        out = []
        for o in reply.outputs:
            shape = tuple(o.shape)
            dt = parse_dtype(o.dtype)
            data = (np.frombuffer(o.data, dtype=dt.newbyteorder("<")).astype(dt).reshape(shape)
                    if fetch else None)
            out.append(RemoteArray(o.handle, shape, o.dtype, layout_from_pb(o.layout), data))
        return out

    def free(self, *arrays: RemoteArray | str) -> int:
        """Free kept arrays on the server; returns how many it had."""
        handles = [a.handle if isinstance(a, RemoteArray) else a for a in arrays]
        return int(self._call(self._stub.Free, pb.FreeRequest(handles=handles), None).freed)

    # ----- about the server -----------------------------------------------------------
    def version(self, *, timeout: float | None = None) -> pb.VersionReply:
        """The server's versions, plan formats, backend and limits."""
        return self._call(self._stub.GetVersion, pb.VersionRequest(), timeout)

    def health(self, service: str = "", *, timeout: float | None = None) -> bool:
        """True if the server answers its health check SERVING (``service``: "" for the
        server, or ``"reshard.v1.Reshard"``); False if it answers otherwise or not at
        all within the deadline (default 5 s)."""
        try:
            reply = self._health.Check(health_pb2.HealthCheckRequest(service=service),
                                       timeout=5.0 if timeout is None else timeout,
                                       metadata=self._metadata)
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

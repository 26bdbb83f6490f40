"""ServeOptions: everything ``reshard serve`` is configured with, checked once."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reshard.cluster import Cluster
from reshard.errors import ReshardError

MIB = 1 << 20
DEFAULT_PORT = 50051
DEFAULT_MAX_MESSAGE = 64 * MIB
DEFAULT_MAX_INLINE = 16 * MIB
INLINE_HEADROOM = 64 << 10
"""Room kept in a message for everything but the inline array bytes (the plan of an
Execute request counts against it too: plans above it need a larger message limit)."""
REQUEST_MEMORY_FACTOR = 3
"""Memory a request holds while its call runs, in multiples of its wire size (measured
with 30 MiB requests: gRPC's received buffer, the bytes handed to Python, the parsed
message); :mod:`reshard.service.admission` counts requests so."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of the server's TLS identity.

    Attributes:
        cert: the server's certificate chain.
        key: its private key.
        client_ca: when set, clients must present a certificate signed by this CA
            (mutual TLS).
    """

    cert: str
    key: str
    client_ca: str | None = None


@dataclass(frozen=True)
class ServeOptions:
    """How the service runs.

    Attributes:
        host: address to listen on (loopback by default; never a wildcard; a
            non-loopback address needs a token).
        port: TCP port; 0 picks a free one (the server reports it).
        backend: the Runtime's backend for Execute (``"local"``, ``"gloo"``, ``"tcp"``,
            ``"nccl"``); None runs no Runtime (Execute answers FAILED_PRECONDITION).
        launcher: the Runtime's launcher (None: the backend's default).
        cluster: the default cluster of requests that name none, and the Runtime's
            cluster (required by gloo / nccl).
        token: when set, every call but health checks must carry the metadata
            ``authorization: Bearer <token>``.
        tls: serve TLS with these files (None: plaintext).
        insecure: serve a non-loopback address with a token in plaintext (no TLS):
            the token crosses the network readable; refused unless this is set.
        max_message_bytes: largest message received or sent.
        max_inline_bytes: largest total of inline array bytes in one Execute request
            or reply.
        workers: threads serving calls.
        grace: seconds in-flight calls get to finish on stop (SIGTERM).
        runtime_timeout: the Runtime's timeout; a caller's deadline shortens it per call.
        plan_cache_bytes: plans kept for repeated Plan / Estimate / Execute requests,
            in (estimated) bytes of memory, least recently used out first (planned and
            executable plans: each cache this much).
        reply_cache_bytes: encoded Plan replies kept for repeated requests, in bytes.
        max_plan_cells: the largest plan a request may ask for, in cells (about tasks;
            :mod:`reshard.service.budget`), checked before any work.
        max_tensors: the most tensors one request may hold, counted off the message
            before anything is built from it.
        max_devices: the most devices one request's mesh or cluster may name, counted
            off the message before anything is built from it.
        max_estimates: the most requests one EstimateMany may hold (refused at once).
        answer_cache_bytes: EstimateMany answers kept for repeated requests, in bytes
            of memory (keys, answers and their error texts), least recently used out
            first.
        job_workers: worker processes for expensive requests (planning, costing,
            verifying large plans), each stopped at its caller's deadline; 0 runs them
            on the serving threads, unbounded (tests).
        job_memory_bytes: each worker's memory cap; a request needing more is refused.
        job_timeout: the most seconds one expensive request's work may take, whatever
            its deadline (a request without one is stopped here); a worker is also
            stopped the moment its caller cancels.
        max_inflight_bytes: the most memory requests in flight hold at once (each counted
            as ``REQUEST_MEMORY_FACTOR`` (3) x its size before parsing, given back when
            its call ends); a request that would pass it is refused with
            RESOURCE_EXHAUSTED. At least 3 x ``max_message_bytes``.
        max_queued_calls: calls accepted at once, serving or waiting for a thread;
            gRPC refuses more with RESOURCE_EXHAUSTED.
        max_search_candidates: the most layers, candidates and edges one Search may
            hold together, counted on the wire before it is parsed.
        max_search_cells: the largest search a Search may ask for, in cells (layers'
            candidates x submesh classes x blocks x degrees:
            :mod:`reshard.service.searches`), checked before any work.
        search_cache_bytes: Search answers kept for repeated requests, in bytes
            (encoded), least recently used out first.
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    backend: str | None = "local"
    launcher: str | None = None
    cluster: Cluster | None = None
    token: str | None = field(default=None, repr=False)
    tls: TlsFiles | None = None
    insecure: bool = False
    max_message_bytes: int = DEFAULT_MAX_MESSAGE
    max_inline_bytes: int = DEFAULT_MAX_INLINE
    workers: int = 8
    grace: float = 10.0
    runtime_timeout: float = 60.0
    plan_cache_bytes: int = 128 * MIB
    reply_cache_bytes: int = 64 * MIB
    max_plan_cells: int = 1 << 21
    max_tensors: int = 100_000
    max_devices: int = 16_384
    max_estimates: int = 10_000
    answer_cache_bytes: int = 32 * MIB
    job_workers: int = 2
    job_memory_bytes: int = 2048 * MIB
    job_timeout: float = 120.0
    max_inflight_bytes: int = 256 * MIB
    max_queued_calls: int = 64
    max_search_candidates: int = 100_000
    max_search_cells: int = 1 << 22
    search_cache_bytes: int = 16 * MIB

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ReshardError(f"port must be 0..65535, got {self.port}; 0 picks a free port")
        for name in ("max_message_bytes", "max_inline_bytes", "workers",
                     "plan_cache_bytes", "reply_cache_bytes", "max_plan_cells",
                     "max_tensors", "max_devices", "max_estimates", "answer_cache_bytes",
                     "job_memory_bytes", "max_inflight_bytes", "max_queued_calls",
                     "max_search_candidates", "max_search_cells", "search_cache_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ReshardError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_inline_bytes > self.max_message_bytes - INLINE_HEADROOM:
            raise ReshardError(
                f"max_inline_bytes ({self.max_inline_bytes}) must leave {INLINE_HEADROOM} "
                f"bytes of max_message_bytes ({self.max_message_bytes}) for the rest of the "
                f"message; lower it or raise max_message_bytes")
        if self.max_inflight_bytes < REQUEST_MEMORY_FACTOR * self.max_message_bytes:
            raise ReshardError(
                f"max_inflight_bytes ({self.max_inflight_bytes}) must be at least "
                f"{REQUEST_MEMORY_FACTOR} x max_message_bytes ({self.max_message_bytes}: a "
                f"request holds about {REQUEST_MEMORY_FACTOR} x its size while parsed), or a "
                f"largest request could never be served")
        if self.max_queued_calls < self.workers:
            raise ReshardError(f"max_queued_calls ({self.max_queued_calls}) must be at least "
                               f"workers ({self.workers})")
        if isinstance(self.job_workers, bool) or not isinstance(self.job_workers, int) or \
                not 0 <= self.job_workers < self.workers:
            raise ReshardError(
                f"job_workers must be an integer from 0 to workers - 1 ({self.workers - 1}: "
                f"serving threads must stay free for cheap calls), got {self.job_workers!r}")
        for name in ("grace", "runtime_timeout", "job_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ReshardError(f"{name} must be > 0 seconds, got {value!r}")
        if self.token is not None and not self.token.strip():
            raise ReshardError("the token is empty; give a non-empty token or none")

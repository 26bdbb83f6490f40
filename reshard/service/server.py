"""Server: the ``reshard.v1.Reshard`` service and ``grpc.health.v1.Health`` on one port.

Example::

    from reshard.service import Server, ServeOptions

    with Server(ServeOptions(port=0)).start() as server:   # loopback, a free port
        print(server.address)                               # "127.0.0.1:41234"
        ...                                                 # serve until the block ends

``stop()`` drains within ``options.grace`` seconds: health turns NOT_SERVING, new calls
are refused, calls in flight get the grace but its last second (or half) to finish,
then the jobs left are killed and the Runtime closes.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from reshard.errors import ReshardError
from reshard.service.admission import ByteBudget, add_service
from reshard.service.auth import TokenInterceptor, check_listen, listen_address, server_credentials
from reshard.service.convert import SERVICE_NAME
from reshard.service.options import ServeOptions
from reshard.service.runtime_host import RuntimeFactory, RuntimeHost
from reshard.service.servicer import ReshardServicer

log = logging.getLogger("reshard.service")

STOP_RESERVE = 1.0
"""Seconds at the end of a stop's grace (at most half of it) kept for what comes after
the calls and the Runtime's workers' own exit: killing the jobs and the workers left
(the launcher's terminate, 0.3 s, then its kill), so that the whole stop holds its
grace."""


def default_runtime_factory(options: ServeOptions) -> RuntimeFactory | None:
    """Makes the Runtime ``options`` ask for (None when ``backend`` is None)."""
    if options.backend is None:
        return None

    def make() -> Any:
        from reshard.runtime import Runtime

        return Runtime(backend=options.backend or "local", cluster=options.cluster,
                       launcher=options.launcher, timeout=options.runtime_timeout)
    return make


def grpc_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    """Channel arguments of the server: explicit message limits, and no port sharing
    (``SO_REUSEPORT`` would let a second server bind the same port unnoticed)."""
    return [("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0)]


class Server:
    """The service, configured by ``options``.

    Args:
        options: address, backend, limits, token, TLS (see :class:`ServeOptions`).
        runtime_factory: makes the Runtime for Execute (default: from
            ``options.backend``; tests pass their own).

    Raises:
        ReshardError: a wildcard address, or a non-loopback one without a token.
    """

    def __init__(self, options: ServeOptions,
                 runtime_factory: RuntimeFactory | None = None) -> None:
        check_listen(options.host, options.token, options.tls, options.insecure)
        self.options = options
        factory = runtime_factory or default_runtime_factory(options)
        self.host = RuntimeHost(factory, options.max_inline_bytes, options.runtime_timeout)
        self.servicer = ReshardServicer(options, self.host)
        self.inflight = ByteBudget(options.max_inflight_bytes)
        self.health = health.HealthServicer()
        self._server: grpc.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        """``host:port`` a client connects to (after :meth:`start`)."""
        return listen_address(self.options.host, self.port)

    def start(self) -> Server:
        """Make the Runtime, bind the port and serve; returns self.

        Raises:
            ReshardError: the port cannot be bound.
        """
        o = self.options
        self.host.start()
        self.servicer.jobs.start()
        interceptors = [TokenInterceptor(o.token)] if o.token is not None else []
        server = grpc.server(ThreadPoolExecutor(max_workers=o.workers, thread_name_prefix="reshard-rpc"),
                             interceptors=interceptors, options=grpc_options(o.max_message_bytes),
                             maximum_concurrent_rpcs=o.max_queued_calls)
        add_service(self.servicer, server, "Reshard", self.inflight, self.servicer.wire_checks())
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        where = listen_address(o.host, o.port)
        try:
            port = (server.add_secure_port(where, server_credentials(o.tls)) if o.tls
                    else server.add_insecure_port(where))
        except RuntimeError as e:
            port = 0
            why = str(e)
        else:
            why = "the address is in use or not this machine's"
        if not port:
            self.host.close()
            self.servicer.jobs.close()
            raise ReshardError(f"cannot listen on {where}: {why}; pick another --port (0 "
                               f"picks a free one) or an address of this machine")
        self.port = port
        server.start()
        self._server = server
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self

    def stop(self, grace: float | None = None) -> None:
        """Drain and stop within ``grace`` seconds (default ``options.grace``):
        NOT_SERVING, refuse new calls, let calls in flight finish until the last
        :data:`STOP_RESERVE` (at most half) of the grace, then kill the jobs still
        running and close the Runtime (its workers get what is left of the grace, less
        that reserve, then are killed). Returns at the grace even when closing the Runtime takes longer
        (its launcher's fork server slow to exit): that close goes on in the background,
        logged."""
        self.health.enter_graceful_shutdown()
        grace = self.options.grace if grace is None else grace
        deadline = time.monotonic() + grace
        reserve = min(STOP_RESERVE, grace / 2)
        if self._server is not None:
            done = self._server.stop(grace - reserve)  # then every call left is cancelled
            done.wait(grace - reserve)
            self.servicer.jobs.close()  # calls waiting on jobs end at once
            done.wait(max(0.0, deadline - reserve / 2 - time.monotonic()))
        self.servicer.jobs.close()
        closing = threading.Thread(
            target=self.host.close, args=(max(0.0, deadline - reserve - time.monotonic()),),
            name="reshard-service-close", daemon=True)
        closing.start()
        closing.join(max(0.0, deadline - time.monotonic()))
        if closing.is_alive():
            log.warning("reshard serve: closing the Runtime ran past the %g s grace (its "
                        "launcher still stopping); it goes on in the background", grace)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops (or ``timeout`` seconds); True if it stopped."""
        if self._server is None:
            return True
        return bool(self._server.wait_for_termination(timeout))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""Who may call the service: the listening address rule, the token check, TLS.

* The server listens on loopback unless told otherwise, and never on a wildcard
  address (every interface): name the one interface to serve.
* A non-loopback address needs a token: every call but the health checks must carry
  the metadata ``authorization: Bearer <token>`` (compared in constant time); others
  get UNAUTHENTICATED. Over plaintext the token can be read off the network, so serve
  TLS there too (``--tls-cert`` / ``--tls-key``; ``--tls-client-ca`` for mutual TLS).
"""

from __future__ import annotations

import hmac
import ipaddress
import pathlib
from collections.abc import Callable
from typing import Any

import grpc

from reshard.comm.bootstrap.sockets import is_wildcard
from reshard.errors import ReshardError
from reshard.service.options import TlsFiles

TOKEN_KEY = "authorization"
"""Metadata key of the token (``Bearer <token>``)."""

OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
"""Methods callable without the token (they tell only whether the server serves)."""

def _bare(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    bare = _bare(host)
    if bare == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def listen_address(host: str, port: int) -> str:
    """``host:port`` as gRPC takes it (IPv6 literals in brackets)."""
    bare = _bare(host)
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


def check_listen(host: str, token: str | None, tls: TlsFiles | None,
                 insecure: bool = False) -> None:
    """Refuse wildcard addresses, non-loopback ones without a token, and non-loopback
    ones without TLS (the token would cross the network in plaintext) unless
    ``insecure``.

    Raises:
        ReshardError: naming the address and what to do instead.
    """
    if is_wildcard(host):
        raise ReshardError(
            f"refusing to listen on the wildcard address {host!r} (every interface); "
            f"give the one interface's address to serve, e.g. --host 127.0.0.1 or the "
            f"cluster network's address")
    if not is_loopback(host) and token is None:
        raise ReshardError(
            f"serving on {host!r}, which is not loopback, needs a token: pass "
            f"--token-file FILE (or RESHARD_SERVICE_TOKEN), and TLS (--tls-cert, --tls-key) "
            f"so that the token does not cross the network in plaintext")
    if not is_loopback(host) and tls is None and not insecure:
        raise ReshardError(
            f"serving on {host!r}, which is not loopback, without TLS sends the token in "
            f"plaintext for anyone on the network to read: give --tls-cert and --tls-key, "
            f"or --insecure to serve plaintext anyway (on a network you trust)")


def _read(path: str, what: str) -> bytes:
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as e:
        raise ReshardError(f"cannot read the {what} {path!r}: {e.strerror}; give a readable "
                           f"PEM file") from None


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """The server's TLS credentials (mutual TLS when ``tls.client_ca`` is set)."""
    ca = _read(tls.client_ca, "client CA") if tls.client_ca else None
    return grpc.ssl_server_credentials(
        [(_read(tls.key, "TLS key"), _read(tls.cert, "TLS certificate"))],
        root_certificates=ca, require_client_auth=ca is not None)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata carrying ``token``."""
    return ((TOKEN_KEY, f"Bearer {token}"),)


def _deny(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that refuses the call."""
    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      "missing or wrong token: send the metadata 'authorization: Bearer "
                      "<token>' with the server's token (Client(..., token=...))")

    kinds: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(refuse, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses calls without the server's token (health checks excepted).

    Args:
        token: the shared secret.
    """

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method in OPEN_METHODS:  # type: ignore[attr-defined]
            return handler
        given = b""
        for key, value in handler_call_details.invocation_metadata or ():  # type: ignore[attr-defined]
            if key == TOKEN_KEY:
                given = value.encode() if isinstance(value, str) else value
        if hmac.compare_digest(given, self._expected):
            return handler
        return _deny(handler)

"""Admission: a budget on the bytes of requests the server holds at once.

gRPC hands a handler its request already parsed, after the bytes arrived; a parsed
request holds two to three times its wire size. The service's methods are therefore
registered to receive the request's raw bytes: a call first takes the memory its
request will hold (:data:`REQUEST_MEMORY_FACTOR` times its size) from the server's
:class:`ByteBudget` (``--max-inflight-bytes``) and is refused with RESOURCE_EXHAUSTED
when that would pass the budget, before any parsing; the bytes are given back when the
call ends (a streamed reply's, when its last chunk is sent). Then the repeated messages
a budget limits are counted in the bytes (:mod:`reshard.service.wire`: a request of a
million tiny tensors parses into ten times its size) and a request over its budget is
refused, still unparsed. Unknown fields are dropped right after parsing (a client may
pad a request with them).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import grpc

from reshard.service.budget import OverBudget
from reshard.service.options import REQUEST_MEMORY_FACTOR
from reshard.service.status import ERROR_KEY, ServiceError, details
from reshard.service.v1 import reshard_pb2 as pb


class ByteBudget:
    """A thread-safe count of bytes held, never above ``capacity``.

    Args:
        capacity: the most bytes held at once.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Bytes held now."""
        with self._lock:
            return self._held

    def take(self, n: int) -> bool:
        """Hold ``n`` more bytes if that stays within the capacity; True if held."""
        with self._lock:
            if self._held + n > self.capacity:
                return False
            self._held += n
            return True

    def give(self, n: int) -> None:
        """Give back ``n`` bytes taken before."""
        with self._lock:
            self._held -= n


def _refuse(context: grpc.ServicerContext, size: int, budget: ByteBudget) -> None:
    context.set_trailing_metadata(((ERROR_KEY, "ServiceError"),))
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, details(
        f"the server holds {budget.held} bytes for requests in flight; this request "
        f"needs {size} ({REQUEST_MEMORY_FACTOR} x its size), over its budget of "
        f"{budget.capacity} (--max-inflight-bytes); retry later"))


def _parse(parse: Callable[[bytes], Any], raw: bytes, context: grpc.ServicerContext) -> Any:
    try:
        request = parse(raw)
    except Exception as e:  # noqa: BLE001 - any decoding failure is the caller's
        context.set_trailing_metadata(((ERROR_KEY, "ServiceError"),))
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, details(
            f"the request is not a valid {parse.__qualname__.split('.')[0]} message: {e}"))
    request.DiscardUnknownFields()  # they mean nothing here; a client may pad with them
    return request


def _check(check: Callable[[bytes], None], raw: bytes, context: grpc.ServicerContext) -> None:
    """``check(raw)``; its refusal (:class:`OverBudget`: RESOURCE_EXHAUSTED, or a
    :class:`ServiceError` with its own code) ends the call."""
    try:
        check(raw)
    except (OverBudget, ServiceError) as e:
        code = e.code if isinstance(e, ServiceError) else grpc.StatusCode.RESOURCE_EXHAUSTED
        context.set_trailing_metadata(((ERROR_KEY, "ServiceError"),))
        context.abort(code, details(str(e)))


@contextlib.contextmanager
def _admitted(raw: bytes, parse: Callable[[bytes], Any], context: grpc.ServicerContext,
              budget: ByteBudget, check: Callable[[bytes], None]) -> Iterator[Any]:
    """The parsed request, its memory held from ``budget`` for the block (or the call
    refused, before parsing: over the budget, or by ``check`` of its bytes)."""
    size = REQUEST_MEMORY_FACTOR * len(raw)
    if not budget.take(size):
        _refuse(context, size, budget)
    try:
        _check(check, raw, context)
        yield _parse(parse, raw, context)
    finally:
        budget.give(size)


def _unary(method: Callable[[Any, grpc.ServicerContext], Any], parse: Callable[[bytes], Any],
           budget: ByteBudget, check: Callable[[bytes], None]
           ) -> Callable[[bytes, grpc.ServicerContext], Any]:
    def handle(raw: bytes, context: grpc.ServicerContext) -> Any:
        with _admitted(raw, parse, context, budget, check) as request:
            return method(request, context)
    return handle


def _streaming(method: Callable[[Any, grpc.ServicerContext], Iterator[Any]],
               parse: Callable[[bytes], Any], budget: ByteBudget,
               check: Callable[[bytes], None]
               ) -> Callable[[bytes, grpc.ServicerContext], Iterator[Any]]:
    def handle(raw: bytes, context: grpc.ServicerContext) -> Iterator[Any]:
        with _admitted(raw, parse, context, budget, check) as request:
            yield from method(request, context)
    return handle


def _encoder(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """A reply serializer that sends a reply already encoded (bytes) as it is."""
    def encode(reply: Any) -> bytes:
        return reply if isinstance(reply, bytes) else serialize(reply)
    return encode


def _unchecked(raw: bytes) -> None:
    """No check of a request's bytes."""


def add_service(servicer: Any, server: grpc.Server, service: str, budget: ByteBudget,
                checks: Mapping[str, Callable[[bytes], None]] = MappingProxyType({})) -> None:
    """Register every method of ``service`` (a service of reshard's proto, e.g.
    ``"Reshard"``) on ``server``, served by ``servicer``'s method of the same name, each
    request's bytes counted against ``budget`` and checked by ``checks[method]`` (which
    raises :class:`OverBudget` or a :class:`ServiceError` to refuse them) before it is
    parsed. A method may return
    its reply encoded (bytes)."""
    desc = pb.DESCRIPTOR.services_by_name[service]
    handlers = {}
    for m in desc.methods:
        parse = getattr(pb, m.input_type.name).FromString
        reply = _encoder(getattr(pb, m.output_type.name).SerializeToString)
        method = getattr(servicer, m.name)
        check = checks.get(m.name, _unchecked)
        if m.server_streaming:
            handlers[m.name] = grpc.unary_stream_rpc_method_handler(
                _streaming(method, parse, budget, check), response_serializer=reply)
        else:
            handlers[m.name] = grpc.unary_unary_rpc_method_handler(
                _unary(method, parse, budget, check), response_serializer=reply)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(desc.full_name,
                                                                          handlers),))


__all__ = ["ByteBudget", "add_service"]

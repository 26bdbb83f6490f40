"""Errors across the wire: a server-side :class:`reshard.ReshardError` becomes a gRPC
status, and the Client raises the same class with the same message.

The status code says what kind of failure it was (the caller's input, the server's
state, an execution failure, a deadline); the trailing metadata key
:data:`ERROR_KEY` names the exact reshard error class. Mapping:

============================  =====================================================
server side                   status code
============================  =====================================================
``ExecutionError``            ``ABORTED``; ``DEADLINE_EXCEEDED`` when the caller's
                              deadline was the Runtime timeout that expired
``ServiceError``              its own code (e.g. ``FAILED_PRECONDITION``: the server
                              runs no Runtime; ``RESOURCE_EXHAUSTED``: an answer
                              over the message limit)
``MissingDependencyError``    ``FAILED_PRECONDITION`` (the server lacks a package)
any other ``ReshardError``    ``INVALID_ARGUMENT``
anything else (a bug)         ``INTERNAL`` (the Client raises ``ServiceError``)
============================  =====================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NoReturn

import grpc

from reshard import errors

ERROR_KEY = "reshard-error"
"""Trailing metadata key naming the reshard error class of a failed call."""

MAX_DETAILS = 4000
"""Characters of an error message sent as status details (the rest is cut: details
travel in HTTP/2 headers, which peers limit to a few KiB)."""


class ServiceError(errors.ReshardError):
    """A call failed for a reason of the service rather than of the request's content:
    the server is unreachable or draining, the token was refused, a message was over
    the size limit, the server runs no Runtime, or the server hit a bug.

    Attributes:
        code: the gRPC status code.
    """

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.UNKNOWN) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple:
        return (type(self), (str(self), self.code))


ERROR_CLASSES: Mapping[str, type[errors.ReshardBaseError]] = MappingProxyType({
    cls.__name__: cls for cls in (
        errors.ReshardError, errors.MeshError, errors.SpecError, errors.ShapeError,
        errors.DTypeError, errors.ClusterError, errors.OptionError, errors.StrategyError,
        errors.PartialError, errors.SearchError,
        errors.PlanError, errors.ExecutionError, errors.MissingDependencyError, ServiceError)
})
"""Every error class that crosses the wire, by name (the value of :data:`ERROR_KEY`)."""

CODES: tuple[tuple[type[errors.ReshardBaseError], grpc.StatusCode], ...] = (
    (errors.ExecutionError, grpc.StatusCode.ABORTED),
    (errors.MissingDependencyError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.ReshardError, grpc.StatusCode.INVALID_ARGUMENT),
)
"""Status code by error class, most specific first (ServiceError carries its own)."""


def status_code(error: errors.ReshardBaseError, deadline_expired: bool) -> grpc.StatusCode:
    """The status code of a server-side error (see the module docstring).

    Args:
        error: what the handler raised.
        deadline_expired: the caller's deadline has passed (an execution failure is then
            the Runtime timeout the deadline became).
    """
    if isinstance(error, ServiceError):
        return error.code
    if isinstance(error, errors.ExecutionError) and deadline_expired:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return next(code for cls, code in CODES if isinstance(error, cls))


def error_name(error: BaseException) -> str:
    """The :data:`ERROR_KEY` value for ``error``: its class name if it crosses the wire,
    else the nearest crossing base class's."""
    for cls in type(error).__mro__:
        if ERROR_CLASSES.get(cls.__name__) is cls:
            return cls.__name__
    return ServiceError.__name__


def details(message: str) -> str:
    """``message`` cut to :data:`MAX_DETAILS` characters."""
    if len(message) <= MAX_DETAILS:
        return message
    return message[:MAX_DETAILS - 20] + " ... (message cut)"


def rpc_error(e: grpc.RpcError) -> errors.ReshardBaseError:
    """The reshard error a failed call stands for: the class the server named in
    :data:`ERROR_KEY` with its message, else :class:`ServiceError` with the status code."""
    if isinstance(e, grpc.Call):  # what every failed call of a channel raises
        code, text, trailing = e.code(), e.details() or "", e.trailing_metadata()
    else:
        code, text, trailing = grpc.StatusCode.UNKNOWN, str(e), None
    name = dict(trailing or ()).get(ERROR_KEY)
    cls = ERROR_CLASSES.get(str(name)) if name is not None else None
    if cls is None or cls is ServiceError:
        return ServiceError(f"{code.name}: {text}" if cls is None else str(text), code)
    return cls(text)


def raise_rpc_error(e: grpc.RpcError) -> NoReturn:
    """Raise :func:`rpc_error` of ``e``."""
    raise rpc_error(e) from None

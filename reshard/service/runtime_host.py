"""The Runtime the server owns for Execute, and the arrays it keeps by handle.

A handle is the key of an array on the server's Runtime. Arrays come in through a
request's inline bytes (placed on the plan tensor's source layout) or by handle; they
go out by handle (``keep``) and/or as bytes (``fetch``). Inline bytes of one request,
and of one reply, are limited to ``max_inline_bytes``.

A caller's deadline becomes the Runtime timeout of the call (less a margin to send the
answer back). As for any Runtime timeout, running out of it means the workers are in
an unknown state: the Runtime shuts down, the call fails with ExecutionError (status
DEADLINE_EXCEEDED), every handle of that Runtime is gone, and the next Execute starts
a new Runtime.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from reshard.dtypes import itemsize, parse_dtype
from reshard.errors import ExecutionError, ReshardError, ShapeError
from reshard.planner.ir import ReshardPlan
from reshard.planner.values.tasks import TensorSpec
from reshard.service.status import ServiceError

DEADLINE_MARGIN = 0.5
"""Seconds before the caller's deadline at which the server gives up waiting, so that
its own answer (the stuck devices found, their reports collected: a twentieth of the
call's timeout) still arrives in time (half the time left, for deadlines under twice
this)."""

RuntimeFactory = Callable[[], Any]
"""Makes the server's Runtime (a :class:`reshard.Runtime` or an object with its
put / get / execute / free / close methods and its ``failed`` property)."""


def call_timeout(time_left: float | None, default: float) -> float:
    """The Runtime timeout of a call with ``time_left`` seconds to its deadline (None:
    no deadline)."""
    if time_left is None:
        return default
    margin = min(DEADLINE_MARGIN, time_left / 2)
    return max(1e-3, min(default, time_left - margin))


def deadline_expired(time_left: float | None) -> bool:
    """True once a call has no more time than the margin :func:`call_timeout` keeps."""
    return time_left is not None and time_left <= DEADLINE_MARGIN


@dataclass(frozen=True)
class Output:
    """One array an Execute produced.

    Attributes:
        handle: its handle, empty unless kept.
        tensor: shape, dtype and layouts of the plan tensor it is the result of.
        data: its bytes (C order, little-endian) when fetched, else None.
    """

    handle: str
    tensor: TensorSpec
    data: bytes | None


Input = str | bytes
"""A handle (str) or the inline bytes of a global array."""


def _le(dtype: str) -> np.dtype:
    return parse_dtype(dtype).newbyteorder("<")


class RuntimeHost:
    """Owns the server's Runtime (made by ``factory``, remade after a failure) and
    its handles.

    Args:
        factory: makes a Runtime; None: the server runs none (Execute is refused).
        max_inline_bytes: inline bytes allowed in one request and in one reply.
        default_timeout: the Runtime timeout of calls without a deadline.
    """

    def __init__(self, factory: RuntimeFactory | None, max_inline_bytes: int,
                 default_timeout: float) -> None:
        self._factory = factory
        self.max_inline_bytes = max_inline_bytes
        self.default_timeout = default_timeout
        self._lock = threading.Lock()
        self._runtime: Any = None
        self._replaced: Any = None  # a failed Runtime _current replaced, to close
        self._arrays: dict[str, Any] = {}
        self._closed = False

    # ----- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        """Make the Runtime now (so that a bad configuration fails at start-up)."""
        if self._factory is not None:
            self._current()

    def close(self, grace: float | None = None) -> None:
        """Close the Runtime (its workers get ``grace`` seconds, then are killed; None:
        the launcher's own); later calls are refused."""
        with self._lock:
            self._closed = True
            rt, self._runtime = self._runtime, None
            self._arrays.clear()
        if rt is not None:
            rt.close(grace)

    def _current(self) -> Any:
        try:
            return self._current_locked()
        finally:
            with self._lock:
                old, self._replaced = self._replaced, None
            if old is not None:
                old.close()

    def _current_locked(self) -> Any:
        with self._lock:
            if self._closed:
                raise ServiceError("the server is shutting down; retry on another server",
                                   grpc.StatusCode.UNAVAILABLE)
            if self._factory is None:
                raise ServiceError(
                    "this server runs no Runtime (reshard serve --backend none); start it "
                    "with --backend local, gloo, tcp or nccl to Execute plans",
                    grpc.StatusCode.FAILED_PRECONDITION)
            if self._runtime is not None and self._runtime.failed:
                # a call past its deadline broke it: the next call gets a new one (closed
                # by _current, outside the lock)
                self._replaced, self._runtime = self._runtime, None
                self._arrays.clear()
            if self._runtime is None:
                self._runtime = self._factory()
            return self._runtime

    def _failed(self, rt: Any) -> None:
        """Forget ``rt`` after an execution failure (it shut itself down) and its
        handles; the next call makes a new Runtime."""
        with self._lock:
            if self._runtime is not rt:
                return
            self._runtime = None
            self._arrays.clear()
        # it is stopping its workers already; waiting for that would cost the caller's
        # answer its deadline
        threading.Thread(target=rt.close, name="reshard-service-close", daemon=True).start()

    @property
    def handles(self) -> int:
        """Arrays kept now."""
        with self._lock:
            return len(self._arrays)

    # ----- execution ------------------------------------------------------------------
    def execute(self, plan: ReshardPlan, inputs: Sequence[Input], *, fetch: bool,
                keep: bool, free_inputs: bool, time_left: Callable[[], float | None]
                ) -> list[Output]:
        """Run ``plan`` on ``inputs`` (one per input tensor of the plan, every one but
        those a scaled cast derives: handle or inline bytes).

        Args:
            plan: a verified plan.
            inputs: handles, or bytes of the global arrays (C order, little-endian).
            fetch: return the outputs' bytes.
            keep: keep the outputs (their handles are returned); else they are freed.
            free_inputs: free the input handles afterwards.
            time_left: seconds to the caller's deadline, None without one.

        Raises:
            ReshardError: bad inputs (the Runtime stays usable).
            ExecutionError: the Runtime failed (it is replaced on the next call).
            ServiceError: no Runtime, shutting down, or inline bytes over the limit.
        """
        given = [plan.tensors[k] for k in plan.inputs]
        if len(inputs) != len(given):
            raise ReshardError(f"the plan moves {len(given)} input tensors but the request "
                               f"has {len(inputs)} inputs; give one input per plan tensor "
                               f"(but a scaled cast's amax and scales, which it derives)")
        self._check_inline(plan, inputs, fetch)
        rt = self._current()
        timeout = lambda: call_timeout(time_left(), self.default_timeout)
        placed: list[Any] = []
        try:
            xs = []
            for i, (x, t) in enumerate(zip(inputs, given)):
                if isinstance(x, bytes):
                    y = rt.put(_array(x, t, i), t.src, timeout=timeout())
                    placed.append(y)
                    xs.append(y)
                else:
                    xs.append(self._lookup(x))
            moved = rt.execute(plan, xs, timeout=timeout())
            ys = moved + [y.scales for y in moved if y.scales is not None]
            specs = [_delivered(plan.tensors[k]) for k in plan.outputs]
            data = ([_bytes(rt.get(y, timeout=timeout()), t) for y, t in zip(ys, specs)]
                    if fetch else [None] * len(ys))
            drop = list(placed) + ([] if keep else list(ys))
            if free_inputs:
                drop += self._forget([x for x in inputs if isinstance(x, str)])
            if drop:
                rt.free(*drop)
            if keep:
                with self._lock:
                    self._arrays.update({y.key: y for y in ys})
        except ExecutionError:
            self._failed(rt)
            raise
        except ReshardError:
            if placed:  # the caller's mistake: the Runtime is fine, drop what we placed
                rt.free(*placed)
            raise
        return [Output(y.key if keep else "", t, d) for y, t, d in zip(ys, specs, data)]

    def _check_inline(self, plan: ReshardPlan, inputs: Sequence[Input], fetch: bool) -> None:
        sent = sum(len(x) for x in inputs if isinstance(x, bytes))
        back = sum(plan.tensors[k].nbytes for k in plan.outputs) if fetch else 0
        for what, n in (("inline input bytes", sent), ("fetched output bytes", back)):
            if n > self.max_inline_bytes:
                raise ServiceError(
                    f"{what} of this request total {n}, over the server's limit of "
                    f"{self.max_inline_bytes} (--max-inline-mb); keep large arrays on the "
                    f"server by handle (keep=True, fetch=False)",
                    grpc.StatusCode.RESOURCE_EXHAUSTED)

    def _lookup(self, handle: str) -> Any:
        with self._lock:
            x = self._arrays.get(handle)
        if x is None:
            raise ReshardError(
                f"no array has handle {handle!r} on this server (freed, never made, or lost "
                f"when the server's Runtime failed); send the array again")
        return x

    def _forget(self, handles: Sequence[str]) -> list[Any]:
        """Drop ``handles`` from the table (each once); returns the arrays that were kept."""
        with self._lock:
            return [self._arrays.pop(h) for h in dict.fromkeys(handles) if h in self._arrays]

    def free(self, handles: Sequence[str]) -> int:
        """Free kept arrays; returns how many were kept (unknown handles are skipped)."""
        found = self._forget(handles)
        with self._lock:
            rt = self._runtime
        if found and rt is not None:
            try:
                rt.free(*found)
            except ExecutionError:
                self._failed(rt)
                raise
        return len(found)


def _delivered(t: TensorSpec) -> TensorSpec:
    """What arrives of plan tensor ``t``: its destination layout in its destination
    dtype."""
    return TensorSpec(t.shape, t.out_dtype, t.dst, t.dst)


def _array(data: bytes, t: TensorSpec, i: int) -> np.ndarray:
    want = math.prod(t.shape) * itemsize(t.dtype)
    if len(data) != want:
        raise ShapeError(
            f"input {i} has {len(data)} bytes, but the plan's tensor {i} is {t.shape} "
            f"{t.dtype} = {want} bytes; send the whole global array in C order")
    return np.frombuffer(data, dtype=_le(t.dtype)).reshape(t.shape)


def _bytes(value: np.ndarray, t: TensorSpec) -> bytes:
    return np.ascontiguousarray(value, dtype=_le(t.dtype)).tobytes()

"""The Backend protocol every data plane implements, and the registry by name.

A backend instance serves one device (one rank). Collectives name their member set
as a sorted tuple of global device ids (the communicator key); rows of an all-gather
follow that order. Buffers are 1-d contiguous arrays of the backend's array module
(numpy for ``local`` and ``gloo``, cupy for ``nccl``).
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, runtime_checkable

from reshard.choice import parse_choice


class BackendKind(enum.Enum):
    """Data planes reshard can execute on."""

    LOCAL = "local"
    GLOO = "gloo"
    NCCL = "nccl"

    @classmethod
    def parse(cls, value: str | BackendKind) -> BackendKind:
        """Accept a BackendKind or its name; raise listing the valid names."""
        return parse_choice(cls, value, "backend")


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, declared up front (as torch's ``register_backend``
    declares its devices): callers read this, they never probe with getattr.

    Attributes:
        moves: dtype names the backend moves; None for every numeric dtype.
        sums: dtype names its reduce can sum; None for every summable dtype.
        groups_need_world: collective communicators are created by every rank of the
            world, members or not (gloo's ``new_group``): every worker must load every
            plan, in one order. False: only a plan's devices load it.
        device: where buffers live: ``"cpu"`` (numpy) or ``"cuda"`` (cupy).
    """

    moves: frozenset[str] | None
    sums: frozenset[str] | None
    groups_need_world: bool
    device: str


@runtime_checkable
class Backend(Protocol):
    """Point-to-point and collective operations of one rank.

    Every blocking operation honours the backend's timeout and raises
    :class:`reshard.ExecutionError` naming the peer(s) when it expires.
    """

    capabilities: ClassVar[Capabilities]
    device: int

    def prepare(self, plan: Any) -> None:
        """Create the communicators ``plan`` needs that this rank lacks (run before
        every plan load, on the workers :attr:`Capabilities.groups_need_world` names)."""

    def activate(self) -> None:
        """Make this rank's device current in the calling thread (a GPU; no-op on CPU)."""

    @property
    def xp(self) -> Any:
        """The array module of the buffers (numpy or cupy)."""

    def empty(self, n: int, dtype: Any) -> Any:
        """A new 1-d buffer of ``n`` elements on this rank's device."""

    def asarray(self, array: Any) -> Any:
        """``array`` placed on this rank's device (no copy when already there)."""

    def to_host(self, array: Any) -> Any:
        """``array`` as a numpy array."""

    def broadcast(self, buf: Any, root: int, group: Sequence[int],
                  chain: Sequence[int] | None = None, *, tag: int = 0) -> None:
        """Send ``buf`` from ``root`` to every member of ``group`` (in place).
        ``chain`` is the plan's order of the receivers (root's host first), for
        backends that pipeline a chain themselves; ``tag`` as for :meth:`send`."""

    def send(self, buf: Any, peer: int, *, tag: int = 0) -> None:
        """Send ``buf`` to ``peer``.

        ``tag`` (the worker passes the task's index in the plan): operations of one
        group between the same pair of ranks are matched by tag, so they may be
        issued and complete in any order. A backend whose operations are matched in
        issue order (every rank issues them in the plan's one global order) may
        ignore it."""

    def recv(self, buf: Any, peer: int, *, tag: int = 0) -> None:
        """Receive from ``peer`` into ``buf`` (the send with the same ``tag``)."""

    def all_gather(self, out: Any, inp: Any, group: Sequence[int]) -> None:
        """``out[i] = inp of group[i]`` on every member; ``out`` is (len(group), n)."""

    def reduce(self, buf: Any, root: int, group: Sequence[int]) -> None:
        """Sum every member's ``buf`` into ``root``'s ``buf``."""

    def group_start(self) -> None:
        """Begin a batch of operations issued together (NCCL group semantics): the
        operations issued until :meth:`group_end` may run concurrently, in any order
        (the worker issues one plan step's tasks as one group; none of them reads
        what another writes). Buffers passed to them must stay untouched until
        :meth:`group_end` returns."""

    def group_end(self) -> None:
        """End the batch begun by :meth:`group_start`. On return, a host-memory
        backend has completed every operation of the batch (received data is in
        place); a stream backend has ordered them before any later work on its
        stream (:meth:`synchronize` waits for them)."""

    def barrier(self, group: Sequence[int]) -> None:
        """Wait until every member of ``group`` has reached the barrier."""

    def synchronize(self) -> None:
        """Wait for outstanding device work (no-op on CPU backends)."""

    def channel(self, name: str) -> Backend:
        """This rank on an independent communication channel (its own communicators),
        so plans on different channels can run concurrently from different threads.
        Communicators of a channel are created in ``prepare`` like the main ones."""

    def close(self) -> None:
        """Release communicators and connections."""


# Lazily imported so that torch and cupy load only inside their backend.
REGISTRY: Mapping[BackendKind, str] = MappingProxyType({
    BackendKind.LOCAL: "reshard.comm.backends.local:LocalBackend",
    BackendKind.GLOO: "reshard.comm.backends.gloo:GlooBackend",
    BackendKind.NCCL: "reshard.comm.backends.nccl:NcclBackend",
})


def backend_class(kind: str | BackendKind) -> type:
    """The class implementing ``kind`` (imports its module now)."""
    module, _, name = REGISTRY[BackendKind.parse(kind)].partition(":")
    return getattr(importlib.import_module(module), name)

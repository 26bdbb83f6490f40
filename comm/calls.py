"""The calls a driver makes on a device's worker: one small frozen dataclass per kind.

A Runtime (or the pipeline runtime above it) submits a :data:`WorkerCall` to a
launcher's worker group (``group.submit(device, call)``); the launcher carries it as it
is (a thread's argument, a pickle down a process's pipe, a Ray actor call's argument)
and the worker runs it through its dispatch table
(:meth:`reshard.comm.worker.DeviceWorker.run`): a call is checked by its type when it is
built, not by a method-name string when it arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from reshard.comm.program import WorkerProgram
from reshard.planner.ir import ReshardPlan


@dataclass(frozen=True)
class LoadPlan:
    """Prepare this device's program of a plan under ``plan_id`` (see
    :meth:`~reshard.comm.worker.DeviceWorker.load_plan`). A driver sends the program it
    cut from a plan it verified; a worker checks the program itself."""

    plan_id: int
    plan: WorkerProgram | ReshardPlan | str | bytes
    channel: str | None = None
    coalesce: bool = True


@dataclass(frozen=True)
class UnloadPlan:
    """Free a loaded plan's buffers."""

    plan_id: int


@dataclass(frozen=True)
class Execute:
    """Run this device's tasks of a loaded plan on stored arrays (per tensor, the key
    of its source shard and the key to store its destination shard under)."""

    plan_id: int
    in_keys: Sequence[str | None]
    out_keys: Sequence[str | None]


@dataclass(frozen=True)
class Put:
    """Store a shard under ``key``."""

    key: str
    shard: Any


@dataclass(frozen=True)
class Get:
    """The shard stored under ``key``, as numpy."""

    key: str


@dataclass(frozen=True)
class Drop:
    """Forget arrays."""

    keys: Sequence[str]


@dataclass(frozen=True)
class Ping:
    """Liveness: the worker answers with its device id."""


@dataclass(frozen=True)
class Stats:
    """What the worker holds: arrays, loaded plans, scratch bytes, channels."""


@dataclass(frozen=True)
class Attach:
    """Build ``factory(worker, *args)`` (``"package.module:callable"``) in the worker
    and keep it under ``name`` (how the pipeline runtime runs its stage code there)."""

    name: str
    factory: str
    args: tuple[Any, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Invoke:
    """Call ``method(*args)`` of the extension attached under ``name``."""

    name: str
    method: str
    args: tuple[Any, ...] = field(default_factory=tuple)


WorkerCall: TypeAlias = (LoadPlan | UnloadPlan | Execute | Put | Get | Drop | Ping | Stats
                         | Attach | Invoke)
"""Any call a worker runs."""

CALLS: tuple[type, ...] = (LoadPlan, UnloadPlan, Execute, Put, Get, Drop, Ping, Stats,
                           Attach, Invoke)
"""Every kind of :data:`WorkerCall` (what a worker's dispatch table must cover)."""


def call_name(call: object) -> str:
    """A call's kind for messages (``"LoadPlan"``)."""
    return type(call).__name__


__all__ = ["CALLS", "Attach", "Drop", "Execute", "Get", "Invoke", "LoadPlan", "Ping", "Put",
           "Stats", "UnloadPlan", "WorkerCall", "call_name"]

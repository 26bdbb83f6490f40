"""The worker of a Runtime: one device's named arrays, plans and extensions, run by an
:class:`~reshard.comm.executor.Executor`.

A :class:`DeviceWorker` is what runs a Runtime's calls on each device (typed calls,
:mod:`reshard.comm.calls`, through the :data:`DISPATCH` table): it keeps the shards
stored under keys, loads plans under the driver's ids
(each device gets its :class:`~reshard.comm.program.WorkerProgram`; receive/pack
scratch buffers are allocated then, per plan, not per call) and executes them on
named arrays. The execution itself, step by step in the plan's global order, is the
executor's: the Runtime is one client of the embeddable executor, not a second copy
of it.

A worker whose communicating call (loading, executing, an extension's) fails, for
any reason, a bad argument included, stops communicating for good (the executor's
latch): every later such call fails at once. Calls issued after the
failed one may already wait in its queue; running them would send their messages to
peers still inside the failed plan, which would take them for that plan's (silently
wrong data, or gloo's size-mismatch abort). Its runtime is shut down anyway.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import numpy as np

from reshard.comm import calls
from reshard.comm.backend import Backend
from reshard.comm.engine.steps import LoadedProgram
from reshard.comm.executor import Executor
from reshard.comm.program import WorkerProgram
from reshard.core.errors import ReshardError
from reshard.planner.ir import ReshardPlan
from reshard.planner.values.tasks import Derive

F = TypeVar("F", bound=Callable[..., Any])


def _communicating(method: F) -> F:
    """A worker call that talks to peers: refused once one has failed here, and its
    own failure refuses every later one (see the module docstring)."""

    @functools.wraps(method)
    def run(self: DeviceWorker, *args: Any, **kwargs: Any) -> Any:
        with self.executor.communicating():
            return method(self, *args, **kwargs)

    return cast(F, run)


class DeviceWorker:
    """Executes plans for one device.

    Args:
        device: the global device id served.
        backend: this device's backend rank.
    """

    def __init__(self, device: int, backend: Backend) -> None:
        self.device = device
        self.backend = backend
        self.executor = Executor(backend)
        self.arrays: dict[str, Any] = {}
        self.plans: dict[int, LoadedProgram] = {}
        self.extensions: dict[str, Any] = {}

    @property
    def channels(self) -> dict[str, Backend]:
        """Backends of the communication channels opened so far."""
        return self.executor.channels

    @property
    def failed(self) -> str | None:
        """Why a communicating call failed here (None: none did)."""
        return self.executor.failed

    @property
    def current(self) -> tuple[int, str] | None:
        """(task index, task text) in flight or last failed."""
        return self.executor.current

    def run(self, call: calls.WorkerCall) -> Any:
        """Run a driver's call (:mod:`reshard.comm.calls`) through :data:`DISPATCH`."""
        run = DISPATCH.get(type(call))
        if run is None:
            raise ReshardError(f"device {self.device}: {call!r:.80} is not a worker call; "
                               f"valid: {[c.__name__ for c in calls.CALLS]}")
        return run(self, call)

    # ----- channels and extensions -----------------------------------------------------
    @_communicating
    def attach(self, name: str, factory: str, *args: Any) -> None:
        """Build ``factory(self, *args)`` (``"package.module:callable"``) in this worker
        and keep it under ``name``: the way layers above comm (the pipeline runtime)
        run their own code next to the worker's arrays and plans."""
        import importlib

        path, _, attr = factory.partition(":")
        self.extensions[name] = getattr(importlib.import_module(path), attr)(self, *args)

    @_communicating
    def invoke(self, name: str, method: str, *args: Any) -> Any:
        """Call ``method`` of the extension ``name``."""
        ext = self.extensions.get(name)
        if ext is None:
            raise ReshardError(f"device {self.device}: no extension {name!r} attached")
        return getattr(ext, method)(*args)

    # ----- data ----------------------------------------------------------------------
    def put(self, key: str, shard: np.ndarray) -> None:
        """Store a shard under ``key`` on this device."""
        self.arrays[key] = self.backend.asarray(np.ascontiguousarray(shard))

    def get(self, key: str) -> np.ndarray:
        """The shard stored under ``key``, as numpy."""
        try:
            return self.backend.to_host(self.arrays[key])
        except KeyError:
            raise ReshardError(f"device {self.device} holds no array {key!r}") from None

    def drop(self, keys: Sequence[str]) -> None:
        """Forget arrays."""
        for k in keys:
            self.arrays.pop(k, None)

    def ping(self) -> int:
        """Liveness check: returns the device id."""
        return self.device

    def stats(self) -> dict[str, int]:
        """What this worker holds: arrays, loaded plans, their scratch bytes, channels."""
        scratch = sum(int(lp.scratch.nbytes) for lp in self.plans.values())
        return {"arrays": len(self.arrays), "plans": len(self.plans),
                "scratch_bytes": scratch, "channels": len(self.channels)}

    # ----- plans ---------------------------------------------------------------------
    @_communicating
    def load_plan(self, plan_id: int, plan: ReshardPlan | WorkerProgram | str | bytes,
                  channel: str | None = None, verified: bool = False,
                  coalesce: bool = True) -> int:
        """Prepare this device's program of ``plan`` (object or JSON; a plan or a
        program) under ``plan_id`` on ``channel`` (default: the main one). Returns the
        number of tasks this device takes part in.

        Args:
            plan_id: the id the driver will execute it by.
            plan: the plan, its JSON, or this device's program (JSON).
            channel: the communication channel.
            verified: JSON text from a driver that verified the plan (not again here).
            coalesce: see :meth:`reshard.comm.executor.Executor.load`.
        """
        lp = self.plans[plan_id] = self.executor.load(plan, channel=channel, verified=verified,
                                                      coalesce=coalesce)
        return lp.num_tasks

    def unload_plan(self, plan_id: int) -> None:
        """Free a plan's scratch buffers."""
        self.plans.pop(plan_id, None)

    @_communicating
    def execute(self, plan_id: int, in_keys: Sequence[str | None],
                out_keys: Sequence[str | None]) -> int:
        """Run this device's tasks of a loaded plan.

        Args:
            plan_id: a plan loaded with :meth:`load_plan`.
            in_keys: per tensor, the key of this device's source shard (None: a tensor
                the plan derives).
            out_keys: per tensor, the key to store this device's destination shard under
                (None: not kept, e.g. a scaled cast's amax).

        Returns:
            Bytes this device sent.
        """
        lp = self.plans.get(plan_id)
        if lp is None:
            raise ReshardError(f"device {self.device}: plan {plan_id} is not loaded")
        src: dict[int, Any] = {}
        for i in lp.src_box:
            if lp.program.tensors[i].derive is not Derive.NONE:
                continue
            key = in_keys[i]
            if key is None or key not in self.arrays:
                raise ReshardError(
                    f"device {self.device} holds no source shard {key!r} for tensor {i}")
            src[i] = self.arrays[key]
        handle = self.executor.run(lp, src)
        dst = handle.synchronize()
        for i, arr in dst.items():
            key = out_keys[i]
            if key is not None:
                self.arrays[key] = arr
        return handle.sent


def _load(w: DeviceWorker, c: calls.LoadPlan) -> int:
    return w.load_plan(c.plan_id, c.plan, c.channel, coalesce=c.coalesce)


DISPATCH: dict[type, Callable[[DeviceWorker, Any], Any]] = {
    calls.LoadPlan: _load,
    calls.UnloadPlan: lambda w, c: w.unload_plan(c.plan_id),
    calls.Execute: lambda w, c: w.execute(c.plan_id, c.in_keys, c.out_keys),
    calls.Put: lambda w, c: w.put(c.key, c.shard),
    calls.Get: lambda w, c: w.get(c.key),
    calls.Drop: lambda w, c: w.drop(c.keys),
    calls.Ping: lambda w, c: w.ping(),
    calls.Stats: lambda w, c: w.stats(),
    calls.Attach: lambda w, c: w.attach(c.name, c.factory, *c.args),
    calls.Invoke: lambda w, c: w.invoke(c.name, c.method, *c.args),
}
"""What a worker runs for each kind of call (:data:`reshard.comm.calls.CALLS`, every
one)."""


__all__ = ["DISPATCH", "DeviceWorker"]

"""The worker loop: one device's part of a plan, in the plan's global order.

A :class:`DeviceWorker` owns the shards held by one device and a :class:`Backend`
rank. The driver loads a plan once (receive/pack scratch buffers are allocated then,
per plan, not per call), then executes it any number of times on named arrays.

A worker whose communicating call (loading, executing, an extension's) fails stops
communicating for good: every later such call fails at once. Calls issued after the
failed one may already wait in its queue; running them would send their messages to
peers still inside the failed plan, which would take them for that plan's (silently
wrong data, or gloo's size-mismatch abort). Its runtime is shut down anyway.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from reshard.comm.backend import Backend
from reshard.comm.packing import pack, recv_target, region, unpack
from reshard.errors import ExecutionError, ReshardError
from reshard.layout import Box, box_size
from reshard.planner.ir import Buffer, ReshardPlan, Task, TaskKind

F = TypeVar("F", bound=Callable[..., Any])


def _communicating(method: F) -> F:
    """A worker call that talks to peers: refused once one has failed here, and its
    own failure refuses every later one (see the module docstring)."""

    @functools.wraps(method)
    def run(self: DeviceWorker, *args: Any, **kwargs: Any) -> Any:
        if self.failed is not None:
            raise ExecutionError(
                f"device {self.device}: not running {method.__name__}: a call failed here "
                f"earlier ({self.failed}); the runtime must be restarted")
        try:
            return method(self, *args, **kwargs)
        except BaseException as e:
            self.failed = f"{type(e).__name__}: {e}"[:400]
            raise

    return cast(F, run)


@dataclass
class LoadedPlan:
    """A plan prepared for one device."""

    plan: ReshardPlan
    tasks: tuple[tuple[int, Task], ...]  # (global index, task) of this device
    src_box: dict[int, Box]  # tensor -> this device's source box
    dst_box: dict[int, Box]  # tensor -> this device's destination box
    scratch: dict[str, Any]  # dtype name -> 1-d scratch buffer
    backend: Backend  # the (channel's) backend the plan runs on


def _scratch_elems(task: Task, device: int) -> int:
    n = box_size(task.box)
    if task.kind is TaskKind.ALLGATHER:
        m = max((box_size(p) for p in task.pieces), default=0)
        return m * (len(task.receivers) + 1)
    if task.kind is TaskKind.COPY:
        return 0
    return n


class DeviceWorker:
    """Executes plans for one device.

    Args:
        device: the global device id served.
        backend: this device's backend rank.
    """

    def __init__(self, device: int, backend: Backend) -> None:
        self.device = device
        self.backend = backend
        self.arrays: dict[str, Any] = {}
        self.plans: dict[int, LoadedPlan] = {}
        self.current: tuple[int, str] | None = None  # (task index, task text) in flight
        self.channels: dict[str, Backend] = {}
        self.extensions: dict[str, Any] = {}
        self.failed: str | None = None  # why a communicating call failed here

    # ----- channels and extensions -----------------------------------------------------
    def backend_for(self, channel: str | None) -> Backend:
        """The backend of a communication channel: plans loaded on different channels
        use separate communicators, so they can run concurrently from different
        threads (the pipeline runtime's transfer threads)."""
        if channel is None:
            return self.backend
        b = self.channels.get(channel)
        if b is None:
            b = self.channels[channel] = self.backend.channel(channel)
        return b

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
        scratch = sum(int(b.nbytes) for lp in self.plans.values() for b in lp.scratch.values())
        return {"arrays": len(self.arrays), "plans": len(self.plans),
                "scratch_bytes": scratch, "channels": len(self.channels)}

    # ----- plans ---------------------------------------------------------------------
    @_communicating
    def load_plan(self, plan_id: int, plan: ReshardPlan | str,
                  channel: str | None = None, verified: bool = False) -> int:
        """Prepare ``plan`` (object or JSON) under ``plan_id`` on ``channel`` (default:
        the main one): the backend creates the communicators it lacks, then scratch
        buffers are allocated. Returns the number of tasks this device takes part in.

        Args:
            plan_id: the id the driver will execute it by.
            plan: the plan, or its JSON.
            channel: the communication channel.
            verified: JSON text from a driver that verified the plan (not again here).
        """
        if isinstance(plan, str):
            plan = ReshardPlan.from_json(plan, verify=not verified)
        backend = self.backend_for(channel)
        try:
            backend.prepare(plan)
        except ReshardError:
            raise
        except Exception as e:
            raise ExecutionError(
                f"device {self.device}: setting up communicators for plan {plan_id} failed: "
                f"{type(e).__name__}: {e}") from e
        d = self.device
        src_box, dst_box = {}, {}
        for i, t in enumerate(plan.tensors):
            if d in t.src.devices:
                src_box[i] = t.src.boxes(t.shape)[d]
            if d in t.dst.devices:
                dst_box[i] = t.dst.boxes(t.shape)[d]
        mine = tuple((i, t) for i, t in enumerate(plan.tasks) if d in t.devices)
        need: dict[str, int] = {}
        for _, t in mine:
            dt = plan.tensors[t.tensor].dtype
            need[dt] = max(need.get(dt, 0), _scratch_elems(t, d))
        scratch = {dt: backend.empty(n, np.dtype(dt)) for dt, n in need.items() if n}
        self.plans[plan_id] = LoadedPlan(plan, mine, src_box, dst_box, scratch, backend)
        return len(mine)

    def unload_plan(self, plan_id: int) -> None:
        """Free a plan's scratch buffers."""
        self.plans.pop(plan_id, None)

    @_communicating
    def execute(self, plan_id: int, in_keys: Sequence[str | None],
                out_keys: Sequence[str]) -> int:
        """Run this device's tasks of a loaded plan.

        Args:
            plan_id: a plan loaded with :meth:`load_plan`.
            in_keys: per tensor, the key of this device's source shard.
            out_keys: per tensor, the key to store this device's destination shard under.

        Returns:
            Bytes this device sent.
        """
        lp = self.plans.get(plan_id)
        if lp is None:
            raise ReshardError(f"device {self.device}: plan {plan_id} is not loaded")
        plan = lp.plan
        backend = lp.backend
        backend.activate()  # e.g. make the GPU current in this thread
        xp = backend.xp
        src: dict[int, Any] = {}
        for i in lp.src_box:
            key = in_keys[i]
            if key is None or key not in self.arrays:
                raise ReshardError(
                    f"device {self.device} holds no source shard {key!r} for tensor {i}")
            src[i] = self.arrays[key]
        dst: dict[int, Any] = {}
        for i, box in lp.dst_box.items():
            t = plan.tensors[i]
            dst[i] = xp.zeros(tuple(b - a for a, b in box), dtype=np.dtype(t.dtype))
        copied: set[int] = set()  # tensors whose source this device reduces into
        sent = 0
        for index, task in lp.tasks:
            self.current = (index, str(task))
            try:
                if task.kind is TaskKind.REDUCE and task.root == self.device and \
                        task.tensor not in copied:
                    src[task.tensor] = src[task.tensor].copy()
                    copied.add(task.tensor)
                sent += self._run(lp, task, src, dst)
            except ReshardError as e:
                raise ExecutionError(
                    f"device {self.device}: task #{index} ({task}) failed: {e}") from e
            except Exception as e:  # backend errors of any type
                raise ExecutionError(
                    f"device {self.device}: task #{index} ({task}) failed: "
                    f"{type(e).__name__}: {e}") from e
        backend.synchronize()
        self.current = None
        for i, arr in dst.items():
            self.arrays[out_keys[i]] = arr
        return sent

    # ----- one task ------------------------------------------------------------------
    def _run(self, lp: LoadedPlan, task: Task, src: dict[int, Any], dst: dict[int, Any]) -> int:
        me = self.device
        b = lp.backend
        i = task.tensor
        scratch = lp.scratch.get(lp.plan.tensors[i].dtype)
        if task.source is Buffer.SRC:
            sbuf, sbox = src.get(i), lp.src_box.get(i)
        else:
            sbuf, sbox = dst.get(i), lp.dst_box.get(i)
        n = box_size(task.box)
        if task.kind is TaskKind.COPY:
            region(dst[i], task.box, lp.dst_box[i])[...] = region(src[i], task.box, lp.src_box[i])
            return 0
        if task.kind is TaskKind.SEND:
            if me == task.root:
                buf = pack(sbuf, task.box, sbox, scratch[:n] if scratch is not None else None)
                b.group_start()
                b.send(buf, task.receivers[0])
                b.group_end()
                return n * buf.itemsize
            target = recv_target(dst[i], task.box, lp.dst_box[i], scratch)
            b.group_start()
            b.recv(target, task.root)
            b.group_end()
            unpack(dst[i], task.box, lp.dst_box[i], target)
            return 0
        if task.kind is TaskKind.BROADCAST:
            group = task.group
            if me == task.root:
                buf = pack(sbuf, task.box, sbox, scratch[:n] if scratch is not None else None)
            else:
                buf = recv_target(dst[i], task.box, lp.dst_box[i], scratch)
            b.group_start()
            b.broadcast(buf, task.root, group, chain=task.receivers)
            b.group_end()
            if me != task.root:
                unpack(dst[i], task.box, lp.dst_box[i], buf)
                return 0
            return n * buf.itemsize
        if task.kind is TaskKind.REDUCE:
            if scratch is None:  # load_plan sizes it for every reduce
                raise ExecutionError(f"device {me}: plan loaded without a reduce buffer")
            buf = scratch[:n]
            buf.reshape(tuple(hi - lo for lo, hi in task.box))[...] = region(
                src[i], task.box, lp.src_box[i])
            b.group_start()
            b.reduce(buf, task.root, task.group)
            b.group_end()
            if me == task.root:
                unpack(src[i], task.box, lp.src_box[i], buf)
                return 0
            return n * buf.itemsize
        if task.kind is TaskKind.ALLGATHER:
            group = task.group
            k = len(group)
            m = max(box_size(p) for p in task.pieces)
            piece_of = dict(zip(task.receivers, task.pieces))
            if scratch is None:  # load_plan sizes it for every all-gather
                raise ExecutionError(f"device {me}: plan loaded without a gather buffer")
            inp = scratch[:m]
            out = scratch[m:m * (k + 1)].reshape(k, m)
            mine = piece_of[me]
            pn = box_size(mine)
            if pn:
                inp[:pn] = region(dst[i], mine, lp.dst_box[i]).reshape(-1)
            b.group_start()
            b.all_gather(out, inp, group)
            b.group_end()
            for row, member in enumerate(group):
                piece = piece_of[member]
                if member != me and box_size(piece):
                    unpack(dst[i], piece, lp.dst_box[i], out[row])
            return pn * inp.itemsize * (k - 1)
        raise ExecutionError(f"unknown task kind {task.kind}")


__all__ = ["DeviceWorker", "LoadedPlan"]

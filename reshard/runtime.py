"""Runtime: the driver side of execution (put / reshard / get / shards / close)."""

from __future__ import annotations

import itertools
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any, Sequence, Union

import numpy as np

from reshard.cluster import Cluster
from reshard.errors import ExecutionError, ReshardError, ShapeError
from reshard.layout import Layout, check_shape
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import parse_dtype, plan_many
from reshard.planner.strategy import Strategy


@dataclass(frozen=True)
class DArray:
    """A handle to a tensor distributed over workers.

    Attributes:
        key: the name its shards are stored under on every worker.
        shape: global shape.
        dtype: dtype name.
        layout: how it is laid out.
    """

    key: str
    shape: tuple[int, ...]
    dtype: str
    layout: Layout

    @property
    def nbytes(self) -> int:
        """Bytes of the global tensor."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


class Runtime:
    """Runs reshard plans on workers, one per device.

    Args:
        backend: ``"local"`` (numpy, one process, the reference), ``"gloo"`` (CPU,
            torch.distributed) or ``"nccl"`` (GPU, cupy).
        cluster: hosts and links; plans are balanced for it. Required for ``gloo`` /
            ``nccl`` (it names the devices to start workers for).
        launcher: ``"thread"`` (local backend only, the default for it),
            ``"process"`` (default for gloo / nccl) or ``"ray"``.
        timeout: seconds any blocking operation may wait before failing.
        address: Ray address (``"auto"``, ``"ray://host:port"``) for ``launcher="ray"``.
        env: extra environment variables for worker processes; ``{device}``,
            ``{rank}`` and ``{host}`` in values are replaced per worker (e.g.
            ``{"NCCL_HOSTID": "h{device}"}``). Workers default to
            ``OMP_NUM_THREADS=1``. The process launcher starts workers with the
            ``forkserver`` method (``RESHARD_START_METHOD=spawn`` in the driver's
            environment selects ``spawn``).
        netns: run each worker inside its cluster host's network namespace: a
            :class:`reshard.microbench.testbed.Testbed` (or a
            :class:`~reshard.comm.launchers.process.NetnsPlacement`); gloo with the
            process launcher only.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        backend: str = "local",
        cluster: Cluster | None = None,
        launcher: str | None = None,
        *,
        timeout: float = 60.0,
        address: str | None = None,
        env: dict[str, str] | None = None,
        netns: Any = None,
    ) -> None:
        from reshard.comm.backend import BackendKind
        from reshard.comm.launchers import LauncherKind, default_launcher, start_group

        self.backend = BackendKind.parse(backend)
        self.launcher = (default_launcher(self.backend) if launcher is None
                         else LauncherKind.parse(launcher))
        if timeout <= 0:
            raise ReshardError(f"timeout must be > 0 seconds, got {timeout}")
        self.timeout = float(timeout)
        self.cluster = cluster
        if cluster is None and self.launcher is not LauncherKind.THREAD:
            raise ReshardError(
                f"Runtime(backend={self.backend.value!r}) needs cluster=... to know which "
                f"devices to start workers for, e.g. cluster=Cluster.regular(2, 4)")
        devices = cluster.devices if cluster is not None else ()
        self._ids = itertools.count()
        self._plans: dict[tuple[ReshardPlan, str | None], int] = {}
        self._closed = False
        self._broken: str | None = None
        self.group = start_group(self.backend, self.launcher, devices, cluster, self.timeout,
                                 address=address, env=env, netns=netns)

    # ----- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        if not self._closed:
            self._closed = True
            self.group.close()

    def __del__(self) -> None:  # best effort; close() is the contract
        try:
            self.close()
        except Exception:
            pass

    def _check_open(self) -> None:
        if self._broken:  # checked first: a failure also closes the runtime
            raise ExecutionError(
                f"this Runtime failed earlier and was shut down: {self._broken}")
        if self._closed:
            raise ReshardError("this Runtime is closed; create a new one")

    # ----- calls -----------------------------------------------------------------------
    def _ensure(self, devices: Sequence[int]) -> None:
        ensure = getattr(self.group, "ensure", None)
        if ensure is not None:
            ensure(devices)
        else:
            missing = sorted(set(devices) - set(self.group.devices))
            if missing:
                raise ReshardError(
                    f"device(s) {missing} have no worker; the runtime was started for "
                    f"{list(self.group.devices)} (its cluster)")

    def _gather(self, futures: dict[int, Future], what: str) -> dict[int, Any]:
        """Wait for per-device futures; on failure shut down and raise one error naming
        the dead devices and the failing tasks."""
        deadline = time.monotonic() + self.timeout + 5.0
        pending = set(futures.values())
        while pending:
            try:
                done, pending = wait(pending, timeout=0.2, return_when="FIRST_EXCEPTION")
            except KeyboardInterrupt:
                # Workers may be mid-plan: their state is unknown, so stop them.
                self._broken = f"{what} was interrupted"
                self.close()
                raise
            failed = [f for f in done if f.exception() is not None]
            dead = self.group.dead()
            if failed or dead or time.monotonic() > deadline:
                if not failed and not dead:
                    reason = f"{what} did not finish within {self.timeout:g}s"
                else:
                    # Give the other workers a moment to report which task they were on.
                    wait(pending, timeout=min(self.timeout, 3.0))
                    reason = self._describe_failure(futures, what)
                self._broken = reason
                self.close()
                raise ExecutionError(reason)
        return {d: f.result() for d, f in futures.items()}

    def _describe_failure(self, futures: dict[int, Future], what: str) -> str:
        parts = []
        dead = self.group.dead()
        for d, why in sorted(dead.items()):
            parts.append(f"device {d} died ({why})")
        for d, f in sorted(futures.items()):
            if f.done() and f.exception() is not None and d not in dead:
                parts.append(str(f.exception()))
        return f"{what} failed: " + "; ".join(parts[:8]) + (
            f" (+{len(parts) - 8} more)" if len(parts) > 8 else "")

    def call(self, calls: dict[int, tuple], what: str) -> dict[int, Any]:
        """Call worker methods, ``{device: (method, *args)}``, concurrently; returns
        ``{device: result}``. A failure anywhere shuts the runtime down and raises one
        :class:`ExecutionError` naming dead devices and failing tasks."""
        return self._call_all(calls, what)

    def _call_all(self, calls: dict[int, tuple], what: str) -> dict[int, Any]:
        self._check_open()
        futures = {d: self.group.submit(d, method, *args) for d, (method, *args) in calls.items()}
        return self._gather(futures, what)

    # ----- data ------------------------------------------------------------------------
    def put(self, array: Any, layout: Layout) -> DArray:
        """Distribute a global array over ``layout``'s devices.

        For a partial layout, the devices with coordinate 0 on every partial axis get
        the value and the other addends are zeros.
        """
        arr = np.asarray(array)
        dt = parse_dtype(arr.dtype)
        layout.spec.check(layout.mesh.ndim, arr.ndim)
        boxes = layout.boxes(arr.shape)
        leaders = layout.partial_leaders()
        shards = {}
        for d, box in boxes.items():
            piece = arr[tuple(slice(a, b) for a, b in box)]
            shards[d] = np.ascontiguousarray(piece) if d in leaders else np.zeros_like(piece)
        return self.put_shards(shards, layout, arr.shape, dt)

    def put_shards(self, shards: dict[int, Any], layout: Layout, shape: Sequence[int],
                   dtype: Any) -> DArray:
        """Distribute given per-device shards (e.g. the addends of a partial sum)."""
        shape_t = check_shape(shape)
        dt = parse_dtype(dtype)
        self._check_devices(layout)
        boxes = layout.boxes(shape_t)
        if set(shards) != set(boxes):
            raise ShapeError(
                f"shards given for devices {sorted(shards)} but layout {layout} has devices "
                f"{sorted(boxes)}; pass exactly one shard per device")
        for d, box in boxes.items():
            want = tuple(b - a for a, b in box)
            got = np.shape(shards[d])
            if tuple(got) != want or np.asarray(shards[d]).dtype != dt:
                raise ShapeError(
                    f"shard of device {d} has shape {tuple(got)} and dtype "
                    f"{np.asarray(shards[d]).dtype}; layout {layout} of a {shape_t} {dt} "
                    f"tensor needs shape {want} and dtype {dt}")
        x = DArray(f"a{next(self._ids)}", shape_t, dt.name, layout)
        self._ensure(layout.devices)
        self._call_all({d: ("put", x.key, np.asarray(s)) for d, s in shards.items()}, "put")
        return x

    def shards(self, x: DArray) -> dict[int, np.ndarray]:
        """Every device's shard of ``x``."""
        return self._call_all({d: ("get", x.key) for d in x.layout.devices}, "get")

    def get(self, x: DArray) -> np.ndarray:
        """The global value of ``x`` (partial addends summed)."""
        shards = self.shards(x)
        out = np.zeros(x.shape, dtype=np.dtype(x.dtype))
        boxes = x.layout.boxes(x.shape)
        done: set = set()
        for group in x.layout.partial_groups():
            box = boxes[group[0]]
            if box in done:
                continue
            done.add(box)
            total = shards[group[0]].copy()
            for d in group[1:]:
                total += shards[d]
            out[tuple(slice(a, b) for a, b in box)] = total
        return out

    def free(self, *arrays: DArray) -> None:
        """Drop arrays from their workers."""
        calls: dict[int, list[str]] = {}
        for x in arrays:
            for d in x.layout.devices:
                calls.setdefault(d, []).append(x.key)
        self._call_all({d: ("drop", keys) for d, keys in calls.items()}, "free")

    # ----- resharding ------------------------------------------------------------------
    def _check_devices(self, layout: Layout) -> None:
        if self.cluster is not None:
            self.cluster.check_devices(layout.devices, f"layout {layout}")

    def plan(self, x: Union[DArray, Sequence[DArray]], layout: Union[Layout, Sequence[Layout]],
             strategy: Union[str, Strategy] = Strategy.BROADCAST) -> ReshardPlan:
        """The plan :meth:`reshard` would run."""
        xs = [x] if isinstance(x, DArray) else list(x)
        lays = [layout] if isinstance(layout, Layout) else list(layout)
        if len(xs) != len(lays):
            raise ReshardError(f"{len(xs)} arrays but {len(lays)} destination layouts")
        return plan_many([(a.shape, a.dtype, a.layout, lay) for a, lay in zip(xs, lays)],
                         cluster=self.cluster, strategy=strategy)

    def reshard(self, x: DArray, layout: Layout,
                strategy: Union[str, Strategy] = Strategy.BROADCAST) -> DArray:
        """Move ``x`` to ``layout`` with a plan of the given strategy."""
        return self.execute(self.plan(x, layout, strategy), [x])[0]

    def reshard_many(self, xs: Sequence[DArray], layouts: Sequence[Layout],
                     strategy: Union[str, Strategy] = Strategy.BROADCAST) -> list[DArray]:
        """Move several arrays with one plan (shared balancing and order)."""
        return self.execute(self.plan(xs, layouts, strategy), xs)

    def load(self, plan: ReshardPlan, channel: str | None = None) -> int:
        """Ship ``plan`` to its workers once (done by :meth:`execute` when needed).

        Args:
            plan: the plan.
            channel: a communication channel name: plans on different channels use
                separate communicators and may run concurrently (the pipeline runtime
                gives each of its links one).

        Returns:
            The plan id the workers know it by.
        """
        pid = self._plans.get((plan, channel))
        if pid is None:
            self._check_open()
            self._ensure(plan.devices)
            pid = next(self._ids)
            text = plan.to_json() if self.launcher.value != "thread" else plan
            # Backends whose communicators are made by every rank of the world (gloo's
            # new_group) need every worker to load every plan, in the same order.
            targets = (self.group.devices if getattr(self.group, "load_everywhere", False)
                       else plan.devices)
            self._call_all({d: ("load_plan", pid, text, channel) for d in targets}, "load plan")
            self._plans[(plan, channel)] = pid
        return pid

    def execute(self, plan: ReshardPlan, xs: Sequence[DArray]) -> list[DArray]:
        """Run ``plan`` on arrays matching its tensors; returns the moved arrays."""
        if len(xs) != len(plan.tensors):
            raise ReshardError(f"plan moves {len(plan.tensors)} tensors, got {len(xs)} arrays")
        for i, (x, t) in enumerate(zip(xs, plan.tensors)):
            if x.shape != t.shape or np.dtype(x.dtype) != np.dtype(t.dtype) or x.layout != t.src:
                raise ShapeError(
                    f"array {i} is {x.shape} {x.dtype} on {x.layout}, but the plan expects "
                    f"{t.shape} {t.dtype} on {t.src}; plan it again for this array")
        pid = self.load(plan)
        outs = [DArray(f"a{next(self._ids)}", t.shape, t.dtype, t.dst) for t in plan.tensors]
        in_keys = [x.key for x in xs]
        out_keys = [y.key for y in outs]
        self._call_all({d: ("execute", pid, in_keys, out_keys) for d in plan.devices},
                       f"plan {pid} ({plan.strategy.value}, {len(plan.tasks)} tasks)")
        return outs

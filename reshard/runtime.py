"""Runtime: the driver side of execution (put / reshard / get / shards / close)."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Self

import numpy as np

from reshard.comm.calls import Drop, Execute, Get, LoadPlan, Put, UnloadPlan, WorkerCall
from reshard.comm.launchers.netns import Placement
from reshard.comm.program import WorkerProgram, programs
from reshard.core.cluster import Cluster
from reshard.core.darray import DArray, LiveArrays, as_array, typed_shard
from reshard.core.dtypes import accumulate, parse_dtype
from reshard.core.errors import ReshardError, ShapeError
from reshard.core.layout import Layout, check_shape
from reshard.loaded_plans import LoadedPlans
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import plan_many
from reshard.planner.schedule.staging import check_budget, staging_by_device
from reshard.planner.values.strategy import Strategy
from reshard.workers import Issued, Workers

DEFAULT_MAX_PLANS = 64
"""Plans a Runtime keeps loaded for :meth:`Runtime.reshard` / :meth:`Runtime.execute`
before it unloads the least recently used one."""



class Runtime:
    """Runs reshard plans on workers, one per device.

    Args:
        backend: ``"local"`` (numpy, one process, the reference), ``"gloo"`` (CPU,
            torch.distributed) or ``"nccl"`` (GPU, cupy).
        cluster: hosts and links; plans are balanced for it. Required for ``gloo`` /
            ``nccl`` (it names the devices to start workers for).
        launcher: ``"thread"`` (local backend only, the default for it),
            ``"process"`` (default for gloo / nccl) or ``"ray"``.
        timeout: seconds a call may wait on a worker that makes no progress; also the
            bound of every blocking operation inside the workers (see below).
        address: Ray address (``"auto"``, ``"ray://host:port"``) for ``launcher="ray"``.
        env: extra environment variables for worker processes; ``{device}``,
            ``{rank}`` and ``{host}`` in values are replaced per worker (e.g.
            ``{"NCCL_HOSTID": "h{device}"}``). Workers default to
            ``OMP_NUM_THREADS=1``. The process launcher starts workers from reshard's
            own entry point (never from the caller's ``__main__``).
        netns: run each worker inside its cluster host's network namespace: a
            :class:`reshard.testbed.Testbed` (or a
            :class:`~reshard.comm.launchers.netns.NetnsPlacement`); gloo with the
            process launcher only.
        max_plans: plans kept loaded on the workers for :meth:`reshard` and
            :meth:`execute` (each holds scratch buffers); beyond it the least recently
            used is unloaded. Plans loaded with :meth:`load` stay until :meth:`unload`.
        memory_budget: the most bytes of staging (scratch) one plan may hold on a
            worker: :meth:`plan` / :meth:`reshard` plan within it (steps in buckets,
            big boxes in pieces; :func:`reshard.planner.schedule.staging.fit_budget`), and
            :meth:`load` / :meth:`execute` refuse a plan over it. None: unbounded.
        registry: the backends by name (default
            :func:`reshard.comm.backend.builtin_backends`); a Runtime reads the chosen
            entry's capabilities and launchers from it. It starts workers for the
            entries a reshard launcher can start (``local``, ``gloo``, ``nccl``);
            backends that run inside processes the caller owns (``torch``, or one made
            with :func:`~reshard.comm.backend.register_backend`) run there through
            :class:`reshard.comm.executor.Executor`.

    Threads: a Runtime may be shared by any number of threads. Each call issues its
    work to every worker it involves under one lock, so all workers receive all calls
    in one global order and run them one at a time in that order: calls of different
    threads never mix their messages, and no order of calls can deadlock. A thread
    waits for its own results outside the lock, so calls on disjoint devices run
    concurrently and calls sharing a device queue behind each other.

    Timeout: a call fails with :class:`ExecutionError` when a worker it waits on has
    made no progress (finished no call) for ``timeout`` seconds, i.e. at the timeout
    for a call that did not queue behind others; the error names the stuck or dead
    devices and, when they answer within a second, the task each peer was on.

    Errors: bad input (unknown or freed arrays, plans that fail verification, dtypes the
    backend cannot move or sum, shapes that do not match) raises a
    :class:`ReshardError` before anything reaches a worker, and the Runtime stays
    usable. A failure inside a worker (a dead or stuck worker, a backend error) leaves
    the workers in an unknown state: the Runtime shuts down and that call and every
    later one raise one :class:`ExecutionError` naming devices and tasks.

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
        netns: Placement | None = None,
        max_plans: int = DEFAULT_MAX_PLANS,
        registry: Any = None,
        memory_budget: int | None = None,
    ) -> None:
        from reshard.comm.backend import BackendKind, builtin_backends
        from reshard.comm.launchers import LauncherKind, start_group

        entry = (builtin_backends() if registry is None else registry).entry(backend)
        if not entry.launchers or entry.name not in {k.value for k in BackendKind}:
            raise ReshardError(
                f"backend {entry.name!r} runs inside processes that already exist (no "
                f"reshard launcher starts it); use reshard.Executor in those processes, or a "
                f"Runtime with backend {[k.value for k in BackendKind]}")
        self.backend = BackendKind.parse(entry.name)
        self.launcher = LauncherKind.parse(entry.launchers[0] if launcher is None else launcher)
        if self.launcher.value not in entry.launchers:
            raise ReshardError(
                f"the {entry.name} backend is started by launchers {list(entry.launchers)}, "
                f"not {self.launcher.value!r}; pass launcher={entry.launchers[0]!r}")
        if not timeout > 0:
            raise ReshardError(f"timeout must be > 0 seconds, got {timeout}")
        if isinstance(max_plans, bool) or not isinstance(max_plans, int) or max_plans < 1:
            raise ReshardError(f"max_plans must be an integer >= 1, got {max_plans!r}")
        self.timeout = float(timeout)
        self.max_plans = max_plans
        self.memory_budget = check_budget(memory_budget)
        self.cluster = cluster
        if cluster is None and self.launcher is not LauncherKind.THREAD:
            raise ReshardError(
                f"Runtime(backend={self.backend.value!r}) needs cluster=... to know which "
                f"devices to start workers for, e.g. cluster=Cluster.regular(2, 4)")
        self.capabilities = entry.capabilities
        devices = cluster.devices if cluster is not None else ()
        self._arrays = LiveArrays()
        self._plans = LoadedPlans(max_plans)
        self._plan_ids = itertools.count()
        self._workers = Workers(start_group(self.backend, self.launcher, devices, cluster,
                                            self.timeout, address=address, env=env,
                                            netns=netns), self.timeout)

    # ----- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, grace: float | None = None) -> None:
        """Stop every worker (idempotent; after a failure, wait until they are gone);
        ``grace``: the most seconds workers get to exit on their own before they are
        killed (None: the launcher's own)."""
        self._workers.close(grace)

    def __del__(self) -> None:  # best effort; close() is the contract
        with contextlib.suppress(Exception):  # a finaliser must not raise
            self.close()

    @property
    def group(self) -> Any:
        """The launcher's worker group (its workers, and the fabric of the local
        backend)."""
        return self._workers.group

    @property
    def closed(self) -> bool:
        """Whether this Runtime was closed (or shut down by a failure)."""
        return self._workers.closed

    @property
    def failed(self) -> str | None:
        """Why this Runtime failed and shut down (None while it has not)."""
        return self._workers.broken

    @property
    def loaded_plans(self) -> int:
        """Plans loaded on the workers now (cached and pinned)."""
        return len(self._plans)

    def call(self, calls: dict[int, WorkerCall], what: str) -> dict[int, Any]:
        """Make worker calls (:mod:`reshard.comm.calls`), ``{device: call}``, concurrently; returns
        ``{device: result}``. A failure anywhere shuts the runtime down and raises one
        :class:`ExecutionError` naming dead devices and failing tasks."""
        return self._workers.call(calls, what)

    # ----- arrays ----------------------------------------------------------------------
    def adopt(self, key: str, shape: Sequence[int], dtype: Any, layout: Layout) -> DArray:
        """A handle to an array that code running on the workers created under ``key``
        (e.g. a worker extension's results); it then behaves like any other array."""
        x = DArray(str(key), check_shape(shape), parse_dtype(dtype).name, layout)
        with self._workers.lock:
            self._arrays.add(x)
        return x

    def put(self, array: Any, layout: Layout, *, timeout: float | None = None) -> DArray:
        """Distribute a global array over ``layout``'s devices.

        For a partial layout, the devices with coordinate 0 on every partial axis get
        the value and the other addends are zeros. ``timeout``: this call's (seconds a
        worker may make no progress; default the Runtime's), as for :meth:`execute`.
        """
        arr = as_array(array)
        dt = parse_dtype(arr.dtype)
        if not isinstance(layout, Layout):
            raise ReshardError(f"layout must be a reshard.Layout, got {type(layout).__name__}")
        layout.spec.check(layout.mesh.ndim, arr.ndim)
        boxes = layout.boxes(arr.shape)
        leaders = layout.partial_leaders()
        shards = {}
        for d, box in boxes.items():
            piece = arr[tuple(slice(a, b) for a, b in box)]
            shards[d] = np.ascontiguousarray(piece) if d in leaders else np.zeros_like(piece)
        return self.put_shards(shards, layout, arr.shape, dt, timeout=timeout)

    def put_shards(self, shards: dict[int, Any], layout: Layout, shape: Sequence[int],
                   dtype: Any, *, timeout: float | None = None) -> DArray:
        """Distribute given per-device shards (e.g. the addends of a partial sum)."""
        shape_t = check_shape(shape)
        dt = parse_dtype(dtype)
        if not isinstance(layout, Layout):
            raise ReshardError(f"layout must be a reshard.Layout, got {type(layout).__name__}")
        self._check_devices(layout)
        arrays = _shard_arrays(shards, layout, shape_t, dt)
        w = self._workers
        with w.lock:
            w.check_open()
            w.ensure(layout.devices)
            x = DArray(self._arrays.new_key(), shape_t, dt.name, layout)
            issued = time.monotonic()
            futures = w.issue({d: Put(x.key, a) for d, a in arrays.items()})
            self._arrays.add(x)
        w.wait(futures, "put", issued, timeout)
        return x

    def shards(self, x: DArray, *, timeout: float | None = None) -> dict[int, np.ndarray]:
        """Every device's shard of ``x`` (``timeout``: as for :meth:`execute`)."""
        w = self._workers
        with w.lock:
            w.check_open()
            self._arrays.check([x])
            issued = time.monotonic()
            futures = w.issue({d: Get(x.key) for d in x.layout.devices})
        w.wait(futures, "get", issued, timeout)
        dt = parse_dtype(x.dtype)
        return {d: typed_shard(f.result(), dt) for d, f in futures}

    def get(self, x: DArray, *, timeout: float | None = None) -> np.ndarray:
        """The global value of ``x`` (partial addends summed; ``timeout``: as for
        :meth:`execute`)."""
        shards = self.shards(x, timeout=timeout)
        out = np.zeros(x.shape, dtype=parse_dtype(x.dtype))
        boxes = x.layout.boxes(x.shape)
        done: set = set()
        for group in x.layout.partial_groups():
            box = boxes[group[0]]
            if box in done:
                continue
            done.add(box)
            addends = [shards[d] for d in group]
            total = addends[0] if len(addends) == 1 else accumulate(addends, x.dtype)
            out[tuple(slice(a, b) for a, b in box)] = total
        return out

    def free(self, *arrays: DArray) -> None:
        """Drop arrays from their workers; using them afterwards raises (an array's
        :attr:`DArray.scales` is an array of its own: free it too)."""
        calls: dict[int, list[str]] = {}
        w = self._workers
        with w.lock:
            w.check_open()
            self._arrays.check(arrays)
            if len({x.key for x in arrays}) != len(arrays):
                raise ReshardError("free() got the same array twice")
            for x in arrays:
                self._arrays.remove(x)
                for d in x.layout.devices:
                    calls.setdefault(d, []).append(x.key)
            issued = time.monotonic()
            futures = w.issue({d: Drop(keys) for d, keys in calls.items()})
        w.wait(futures, "free", issued)

    # ----- resharding ------------------------------------------------------------------
    def _check_devices(self, layout: Layout) -> None:
        if self.cluster is not None:
            self.cluster.check_devices(layout.devices, f"layout {layout}")

    def plan(self, x: DArray | Sequence[DArray], layout: Layout | Sequence[Layout],
             strategy: str | Strategy = Strategy.BROADCAST, *, cast: Any = None,
             scale: Any = None) -> ReshardPlan:
        """The plan :meth:`reshard` would run (checked against this runtime's backend)."""
        xs = [x] if isinstance(x, DArray) else list(x)
        lays = [layout] if isinstance(layout, Layout) else list(layout)
        if len(xs) != len(lays):
            raise ReshardError(f"{len(xs)} arrays but {len(lays)} destination layouts")
        for a in xs:
            if not isinstance(a, DArray):
                raise ReshardError(f"expected DArrays, got {type(a).__name__}")
        p = plan_many([(a.shape, a.dtype, a.layout, lay) for a, lay in zip(xs, lays)],
                      cluster=self.cluster, strategy=strategy, cast=cast, scale=scale,
                      memory_budget=self.memory_budget)
        self._check_plan(p)
        return p

    def _check_plan(self, plan: ReshardPlan) -> None:
        """Verify ``plan`` and check it against the backend's capabilities (once per
        plan and context: :func:`_check_plan`)."""
        _check_plan(plan, self.backend, self.cluster, self.memory_budget, self.capabilities)

    def reshard(self, x: DArray, layout: Layout,
                strategy: str | Strategy = Strategy.BROADCAST, *, cast: Any = None,
                scale: Any = None) -> DArray:
        """Move ``x`` to ``layout`` with a plan of the given strategy.

        ``cast``: deliver this dtype, converted at the source (the wire carries it);
        ``scale`` (a cast to float8): ``"tensor"``, ``"block128"``, ``"block128-ue8m0"`` or
        ``"mx32"`` scales, delivered as the result's :attr:`DArray.scales` (see
        :mod:`reshard.core.dtypes`)::

            q = rt.reshard(w, infer, cast="float8_e4m3fn", scale="block128")
            rt.get(q), rt.get(q.scales)   # w ~= q * scales, per 128 x 128 block
        """
        return self.execute(self.plan(x, layout, strategy, cast=cast, scale=scale), [x])[0]

    def reshard_many(self, xs: Sequence[DArray], layouts: Sequence[Layout],
                     strategy: str | Strategy = Strategy.BROADCAST, *, cast: Any = None,
                     scale: Any = None) -> list[DArray]:
        """Move several arrays with one plan (shared balancing and order; ``cast`` and
        ``scale`` as for :meth:`reshard`, for every array)."""
        return self.execute(self.plan(xs, layouts, strategy, cast=cast, scale=scale), xs)

    def _targets(self, plan: ReshardPlan) -> tuple[int, ...]:
        # Backends whose communicators are made by every rank of the world (gloo's
        # new_group) need every worker to load every plan, in the same order.
        return self.group.devices if self.capabilities.groups_need_world else plan.devices

    def _programs(self, plan: ReshardPlan) -> dict[int, WorkerProgram]:
        """Each target worker's program of ``plan`` (verified in :meth:`_check_plan`),
        cut in one pass. They travel as objects: the launcher's transport pickles each
        (a process's pipe, a Ray call's argument), which costs a tenth of JSON both
        ways; a worker checks its own program on load and never sees the whole plan."""
        return programs(plan, self._targets(plan), all_groups=self.capabilities.groups_need_world)

    def _load(self, plan: ReshardPlan, channel: str | None, pin: bool) -> tuple[int, Issued]:
        """The plan's id on the workers, loading it if needed (lock held): returns the id
        and the issued calls (loads, and unloads of evicted plans)."""
        key = (plan, channel)
        pid = self._plans.find(key, pin)
        if pid is not None:
            return pid, []
        w = self._workers
        w.ensure(plan.devices)
        pid = next(self._plan_ids)
        calls = w.issue({d: LoadPlan(pid, prog, channel)
                         for d, prog in self._programs(plan).items()})
        self._plans.add(key, pid, pin)
        for old, old_pid in self._plans.evicted():
            calls += w.issue({d: UnloadPlan(old_pid) for d in self._targets(old)})
        return pid, calls

    def load(self, plan: ReshardPlan, channel: str | None = None) -> int:
        """Ship ``plan`` to its workers and keep it there until :meth:`unload`
        (:meth:`execute` loads plans itself, into a cache of ``max_plans``).

        Args:
            plan: the plan (verified first).
            channel: a communication channel name: plans on different channels use
                separate communicators and may run concurrently (the pipeline runtime
                gives each of its links one).

        Returns:
            The plan id the workers know it by.
        """
        self._check_plan(plan)
        w = self._workers
        with w.lock:
            w.check_open()
            issued = time.monotonic()
            pid, calls = self._load(plan, channel, pin=True)
        w.wait(calls, "load plan", issued)
        return pid

    def unload(self, plan: ReshardPlan, channel: str | None = None) -> None:
        """Free a loaded plan's buffers on its workers (no-op if it is not loaded)."""
        w = self._workers
        with w.lock:
            w.check_open()
            pid = self._plans.drop((plan, channel))
            if pid is None:
                return
            issued = time.monotonic()
            calls = w.issue({d: UnloadPlan(pid) for d in self._targets(plan)})
        w.wait(calls, "unload plan", issued)

    def execute(self, plan: ReshardPlan, xs: Sequence[DArray], *,
                timeout: float | None = None) -> list[DArray]:
        """Run ``plan`` on arrays matching its tensors; returns the moved arrays.

        ``timeout``: seconds this call may wait on a worker that makes no progress
        (default the Runtime's; the service passes a caller's deadline here). Running
        out of it fails the call and shuts the Runtime down, as the Runtime's own
        timeout does.
        """
        self._check_plan(plan)
        _check_inputs(plan, xs)
        inputs = plan.inputs
        w = self._workers
        with w.lock:
            w.check_open()
            self._arrays.check(xs)
            issued = time.monotonic()
            pid, calls = self._load(plan, None, pin=False)
            made = _outputs(plan, self._arrays.new_key)
            in_keys: list[str | None] = [None] * len(plan.tensors)
            for k, x in zip(inputs, xs):
                in_keys[k] = x.key
            out_keys = [None if y is None else y.key for y in made]
            calls += w.issue({d: Execute(pid, in_keys, out_keys) for d in plan.devices})
            outs = [made[k] for k in inputs]
            for y in made:
                if y is not None:
                    self._arrays.add(y)
        w.wait(calls, f"plan {pid} ({plan.strategy.value}, {len(plan.tasks)} tasks)", issued,
                   timeout, plan)
        return outs  # type: ignore[return-value]


def _shard_arrays(shards: Any, layout: Layout, shape: tuple[int, ...],
                  dt: np.dtype) -> dict[int, np.ndarray]:
    """``shards`` checked against ``layout``'s boxes of a ``shape`` ``dt`` tensor: one
    array of the box's shape and the dtype per device."""
    boxes = layout.boxes(shape)
    if not isinstance(shards, dict) or set(shards) != set(boxes):
        raise ShapeError(
            f"shards given for devices {sorted(shards) if isinstance(shards, dict) else shards}"
            f" but layout {layout} has devices {sorted(boxes)}; pass a dict with exactly "
            f"one shard per device")
    arrays = {}
    for d, box in boxes.items():
        want = tuple(b - a for a, b in box)
        got = as_array(shards[d])
        if got.shape != want or got.dtype != dt:
            raise ShapeError(
                f"shard of device {d} has shape {got.shape} and dtype {got.dtype}; "
                f"layout {layout} of a {shape} {dt} tensor needs shape {want} and "
                f"dtype {dt}")
        arrays[d] = got
    return arrays


def _check_plan(plan: ReshardPlan, backend: Any, cluster: Cluster | None,
                memory_budget: int | None, capabilities: Any) -> None:
    """Verify ``plan`` and check it against a backend's capabilities, a cluster's devices
    and a memory budget, once per plan and context (the plan remembers)."""
    from reshard.comm.backend import check_dtypes

    if not isinstance(plan, ReshardPlan):
        raise ReshardError(f"expected a ReshardPlan, got {type(plan).__name__}")
    context = (backend, cluster, memory_budget)  # plan, then run
    if plan.checked_for(context):
        return
    plan.verify()
    check_dtypes(plan.tensors, plan.tasks, capabilities, backend.value)
    if cluster is not None:
        cluster.check_devices(plan.devices, "the plan")
    if memory_budget is not None:
        staged = staging_by_device(plan.tasks, plan.tensors)
        worst = max(staged, key=staged.__getitem__, default=None)
        if worst is not None and staged[worst] > memory_budget:
            raise ReshardError(
                f"the plan stages {staged[worst]} bytes on device {worst}, over the "
                f"Runtime's memory_budget of {memory_budget}; plan it with "
                f"memory_budget={memory_budget} (Runtime.plan does)")
    plan.mark_checked_for(context)


def _check_inputs(plan: ReshardPlan, xs: Sequence[DArray]) -> None:
    """``xs`` are arrays matching the tensors ``plan`` moves, in order."""
    inputs = plan.inputs
    if len(xs) != len(inputs):
        raise ReshardError(f"plan moves {len(inputs)} tensors, got {len(xs)} arrays")
    for i, (x, t) in enumerate(zip(xs, (plan.tensors[k] for k in inputs))):
        if not isinstance(x, DArray):
            raise ReshardError(f"array {i} is a {type(x).__name__}, not a DArray")
        if x.shape != t.shape or x.dtype != t.dtype or x.layout != t.src:
            raise ShapeError(
                f"array {i} is {x.shape} {x.dtype} on {x.layout}, but the plan expects "
                f"{t.shape} {t.dtype} on {t.src}; plan it again for this array")


def _outputs(plan: ReshardPlan, new_key: Any) -> list[DArray | None]:
    """Per plan tensor, the array its destination becomes (None: an amax, internal to
    the plan); a scaled tensor's carries its scales."""
    made: list[DArray | None] = [None] * len(plan.tensors)
    for k in plan.outputs:
        t = plan.tensors[k]
        made[k] = DArray(new_key(), t.shape, t.out_dtype, t.dst)
    for k in plan.inputs:
        t = plan.tensors[k]
        y = made[k]
        if t.link >= 0 and y is not None:
            made[k] = replace(y, scales=made[t.link])
    return made

"""The embeddable executor: a process that already exists runs its own part of plans.

A torch.distributed rank, a Ray actor of another system or an MPI rank owns its
processes, its communicators and its buffers. It wraps one backend rank (made by
the caller, by name through a :class:`~reshard.comm.backend.BackendRegistry`, or
around a torch process group with :meth:`Executor.for_process_group`) in an
:class:`Executor`, loads its :class:`~reshard.comm.program.WorkerProgram` of each
plan once, and runs it any number of times::

    ex = Executor.for_process_group()          # torch.distributed is initialised
    loaded = ex.load(plan)                     # or ex.load(program) / its JSON
    handle = ex.run(loaded, [my_src_shard], out=[my_dst_buffer])
    dst = handle.wait()                        # {tensor index: destination shard}

Sources go in as this device's shard of each tensor (None where it holds none);
destination shards are written into the caller's buffers, or allocated when none
are given. Loading creates the communicators the program needs (the backend's
``prepare``): where :attr:`Capabilities.groups_need_world` is set, every rank of the
backend's world must load every program, in one order, even programs it has no
task in. Every rank runs the programs it takes part in, in one order.

Completion: :meth:`Executor.run` issues every step on the calling thread and
returns a finished :class:`Handle` (host-memory backends have completed the work;
stream backends have ordered it before later work on their stream, and
:meth:`Handle.synchronize` waits for the device). With ``blocking=False`` the steps
run on the executor's own issue thread, one run after another in call order, and
:meth:`Handle.wait` awaits them.

Errors: bad input (a source of the wrong shape or dtype, a plan the backend cannot
move) raises :class:`reshard.ReshardError` before anything is sent, and the executor
stays usable. A failure while communicating leaves the peers inside the failed plan:
the executor refuses every later load and run (their messages would reach peers
still in the old plan) and must be replaced, with the communicators under it.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Self

import numpy as np

from reshard.comm.backend import (
    Backend,
    BackendRegistry,
    Capabilities,
    builtin_backends,
    check_dtypes,
)
from reshard.comm.engine.execution import Execution
from reshard.comm.engine.packing import same_memory
from reshard.comm.engine.steps import LoadedProgram, StepTask, program_steps
from reshard.comm.program import WorkerProgram
from reshard.comm.spmd import LocalPlan, exchange, world_of
from reshard.core.cluster import Cluster
from reshard.core.dtypes import dtype_name, is_torch, parse_dtype, storage, torch_of_numpy
from reshard.core.errors import ExecutionError, PlanError, ReshardError, ShapeError
from reshard.core.gcpause import paused
from reshard.planner.ir import ReshardPlan
from reshard.planner.schedule.staging import check_budget
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Derive, TensorSpec

Shards = Mapping[int, Any] | Sequence[Any]
"""Per tensor of a plan, this device's shard: a sequence in plan order (None where
the device holds none) or a mapping from tensor index."""


class Handle:
    """Completion of one :meth:`Executor.run`.

    Attributes:
        program: the loaded program that ran.
    """

    def __init__(self, lp: LoadedProgram, future: Future,
                 shown: dict[int, Any] | None = None) -> None:
        self.program = lp
        self._future = future
        self._shown = shown  # the results as the caller holds them (None: the backend's)

    def done(self) -> bool:
        """True once the run finished (or failed)."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> dict[int, Any]:
        """This device's destination shards, ``{tensor index: shard}``, once the run
        finished (host-memory backends: complete; stream backends: ordered before later
        work on their stream), in the caller's array type: the ``out`` buffers given
        (the same objects), and where the run allocated, torch tensors sharing the
        shard's memory if the caller gave torch tensors (torch's own bfloat16 and
        float8 dtypes), else the backend's arrays (numpy on CPU).

        Args:
            timeout: seconds to wait; None waits as long as the backend's own timeouts.

        Raises:
            ExecutionError: the run failed (naming the task), or ``timeout`` expired.
        """
        try:
            got = self._future.result(timeout)[0]
            return got if self._shown is None else self._shown  # type: ignore[no-any-return]
        except TimeoutError:
            raise ExecutionError(
                f"device {self.program.device}: run of a {self.program.num_tasks}-task "
                f"program not finished within {timeout:g}s") from None

    @property
    def sent(self) -> int:
        """Bytes this device sent (waits for the run)."""
        self.wait()
        return int(self._future.result()[1])

    def synchronize(self) -> dict[int, Any]:
        """:meth:`wait`, then wait for the device's outstanding work (a GPU stream)."""
        out = self.wait()
        self.program.backend.synchronize()
        return out


def _done(value: Any) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


def _as_given(dst: dict[int, Any], out: dict[int, Any], torch_caller: bool
              ) -> dict[int, Any] | None:
    """The destination shards ``dst`` as the caller holds arrays: its own ``out``
    buffers (by tensor index), and torch views of the others where ``torch_caller`` and
    the backend holds numpy (None: the backend's arrays as they are)."""
    if not out and not torch_caller:
        return None
    return {i: out[i] if i in out else
            torch_of_numpy(buf) if torch_caller and isinstance(buf, np.ndarray) else buf
            for i, buf in dst.items()}


def _dtype_name(array: Any) -> str:
    """The reshard name of an array's dtype (numpy, cupy or torch)."""
    return dtype_name(array.dtype)


def _per_tensor(values: Shards | None, n: int, what: str,
                inputs: Sequence[int] | None = None) -> dict[int, Any]:
    """``values`` as ``{tensor index: value}`` (None entries dropped); a sequence has
    one entry per tensor, or one per input tensor (``inputs``: their indices; every
    tensor but those a scaled cast derives)."""
    if values is None:
        return {}
    if isinstance(values, Mapping):
        bad = [k for k in values if not isinstance(k, int) or not 0 <= k < n]
        if bad:
            raise ReshardError(f"{what}: tensor indices {bad} out of range; the plan has "
                               f"{n} tensors (0..{n - 1})")
        return {k: v for k, v in values.items() if v is not None}
    if inputs is not None and len(inputs) != n and len(values) == len(inputs):
        return {i: v for i, v in zip(inputs, values) if v is not None}
    if len(values) != n:
        also = f" ({len(inputs)} of them inputs)" if inputs is not None and \
            len(inputs) != n else ""
        raise ReshardError(f"{what}: got {len(values)} entries, but the plan has {n} "
                           f"tensors{also}; pass one per tensor (None where this device "
                           f"holds none)")
    return {i: v for i, v in enumerate(values) if v is not None}


def _what(tasks: Sequence[StepTask], step: bool) -> str:
    """The tasks an error names (eight at most), or (``step``) their step."""
    what = ", ".join(str(st) for st in tasks[:8])
    if len(tasks) > 8:
        what += f", +{len(tasks) - 8} more"
    return f"step {tasks[0].task.step} ({what})" if step else what


class _Blame:
    """:meth:`Executor._blame`'s context (a class: entered once per task of every step,
    where a generator-based context costs several times as much)."""

    __slots__ = ("executor", "step", "tasks")

    def __init__(self, executor: Executor, tasks: tuple[StepTask, ...], step: bool) -> None:
        self.executor, self.tasks, self.step = executor, tasks, step

    def __enter__(self) -> None:
        self.executor._current = self.tasks[0]  # formatted only when read

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None,
                 tb: object) -> None:
        if e is None or not isinstance(e, Exception):
            return
        what = f"device {self.executor.device}: {_what(self.tasks, self.step)} failed: "
        if isinstance(e, (ReshardError, ExecutionError)):
            raise ExecutionError(f"{what}{e}") from e
        raise ExecutionError(f"{what}{type(e).__name__}: {e}") from e  # a backend's


class Executor:
    """This process's part of reshard plans, on buffers it owns (module docstring).

    Args:
        backend: the backend rank to run on (this process's device is its ``device``).
        owns_backend: close ``backend`` in :meth:`close` (true when the executor made
            it, as :meth:`create` does).
        capabilities: what plans may ask of the backend (default: the rank's own
            ``capabilities``; :meth:`create` passes what the registry entry declares).
        memory_budget: the most bytes of staging (scratch) a loaded program may hold; a
            program over it is refused at load, and :meth:`load_request` plans within
            it (:func:`reshard.planner.schedule.staging.fit_budget`). None: unbounded.
        arrays: the array type of the shards :meth:`run` returns where the caller gave
            no buffer: ``"torch"`` (CPU torch tensors sharing the shards' memory, in
            torch's own bfloat16 / float8 dtypes; :meth:`for_process_group`'s default),
            or None: torch where the caller gave torch tensors to the run, else the
            backend's own arrays (numpy on CPU).
    """

    def __init__(self, backend: Backend, *, owns_backend: bool = False,
                 capabilities: Capabilities | None = None,
                 memory_budget: int | None = None, arrays: str | None = None) -> None:
        if arrays not in (None, "torch"):
            raise ReshardError(f"arrays must be None or 'torch', got {arrays!r}")
        if not isinstance(backend, Backend):
            raise ReshardError(
                f"Executor needs a backend rank (reshard.comm.backend.Backend), got "
                f"{type(backend).__name__}; build one with Executor.create(name, ...)")
        self.backend = backend
        self.device = int(backend.device)
        self.channels: dict[str, Backend] = {}
        self._current: StepTask | None = None  # the task in flight
        self.failed: str | None = None  # why a communicating call failed here
        self._owns = owns_backend
        self._caps = backend.capabilities if capabilities is None else capabilities
        self._issuer: ThreadPoolExecutor | None = None
        self.memory_budget = check_budget(memory_budget)
        self.arrays = arrays

    # ----- construction ----------------------------------------------------------------
    @classmethod
    def create(cls, name: str, *args: Any, registry: BackendRegistry | None = None,
               memory_budget: int | None = None, arrays: str | None = None,
               **kwargs: Any) -> Executor:
        """An executor on a new rank of backend ``name`` (``registry``'s entry, default
        the built-ins), built with the backend's own arguments."""
        entry = (builtin_backends() if registry is None else registry).entry(name)
        rank = entry.create(*args, **kwargs)
        return cls(rank, owns_backend=True, memory_budget=memory_budget, arrays=arrays,
                   capabilities=entry.capabilities.meet(rank.capabilities))

    @classmethod
    def for_process_group(cls, group: Any = None, *, timeout: float = 60.0,
                          registry: BackendRegistry | None = None) -> Executor:
        """An executor on the ``torch`` backend: this rank of ``group`` (default: the
        default process group), which the caller initialised; device ids are global
        ranks. See :mod:`reshard.comm.backends.torch_dist`."""
        return cls.create("torch", group, timeout=timeout, registry=registry, arrays="torch")

    @property
    def capabilities(self) -> Capabilities:
        """What plans may ask of the backend (checked when a program is loaded)."""
        return self._caps

    def channel(self, name: str | None) -> Backend:
        """The backend of a communication channel (None: the main one): programs loaded
        on different channels use separate communicators, so they may run concurrently
        from different threads."""
        if name is None:
            return self.backend
        b = self.channels.get(name)
        if b is None:
            b = self.channels[name] = self.backend.channel(name)
        return b

    # ----- failure latch ---------------------------------------------------------------
    def _check_usable(self, what: str) -> None:
        if self.failed is not None:
            raise ExecutionError(
                f"device {self.device}: not running {what}: a call failed here earlier "
                f"({self.failed}); peers may still be inside that plan, so replace this "
                f"executor (and its communicators)")

    @contextlib.contextmanager
    def communicating(self) -> Iterator[None]:
        """A block that talks to peers: refused once one has failed here, and its own
        failure refuses every later one (module docstring)."""
        self._check_usable("this call")
        try:
            yield
        except BaseException as e:
            self.failed = f"{type(e).__name__}: {e}"[:400]
            raise

    def _blame(self, *tasks: StepTask, step: bool = False) -> _Blame:
        """Run the body as work on ``tasks``; its errors become ExecutionErrors naming
        the task, or (``step``) the step and its tasks on this device."""
        return _Blame(self, tasks, step)

    @property
    def current(self) -> tuple[int, str] | None:
        """(task index, task text) in flight, or of the last that failed."""
        st = self._current
        return None if st is None else (st.index, str(st.task))

    # ----- programs ----------------------------------------------------------------------
    def program(self, plan: ReshardPlan | WorkerProgram | str | bytes,
                verified: bool = False) -> WorkerProgram:
        """This device's program of ``plan`` (a plan, a program, or either's JSON;
        ``verified``: plan JSON a verifying driver sent, not verified again), checked
        against the backend's capabilities."""
        if isinstance(plan, (str, bytes)):
            try:
                raw = json.loads(plan)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ReshardError(f"plan or program is not valid JSON: {e}") from None
            if isinstance(raw, dict) and "device" in raw:
                return self._accepted(WorkerProgram.from_dict(raw))  # which checks it
            else:
                plan = ReshardPlan.from_dict(raw, verify=not verified)
                if verified:  # trust the driver's verification; cut without redoing it
                    plan.assume_verified()
        if isinstance(plan, ReshardPlan):
            prog = WorkerProgram.of(plan, self.device)
        elif isinstance(plan, WorkerProgram):
            prog = plan
            prog.check()  # it may come from another process (a pickled call's argument)
        else:
            raise ReshardError(f"expected a ReshardPlan, a WorkerProgram or JSON, got "
                               f"{type(plan).__name__}")
        return self._accepted(prog)

    def _accepted(self, prog: WorkerProgram) -> WorkerProgram:
        """``prog`` if it is this device's and the backend can run its dtypes."""
        if prog.device != self.device:
            raise ReshardError(
                f"this is device {prog.device}'s program, but the executor runs device "
                f"{self.device}; cut it with WorkerProgram.of(plan, {self.device})")
        check_dtypes(prog.tensors, (t for _, t in prog.tasks), self.capabilities,
                     self.backend.name)
        return prog

    def load(self, plan: ReshardPlan | WorkerProgram | str | bytes, *,
             channel: str | None = None, verified: bool = False,
             coalesce: bool = True) -> LoadedProgram:
        """Prepare this device's program of ``plan`` on ``channel``: the backend creates
        the communicators it lacks, then scratch buffers are allocated once.

        Args:
            plan: a ReshardPlan (verified here), a WorkerProgram, or either's JSON.
            channel: the communication channel (None: the main one).
            verified: see :meth:`program`.
            coalesce: small transfers of a step that share their route travel as one
                message (:mod:`reshard.planner.schedule.coalesce`); every rank must agree.

        Returns:
            The loaded program, to :meth:`run` any number of times.
        """
        return self._loaded(self.program(plan, verified), channel, coalesce)

    def _loaded(self, prog: WorkerProgram, channel: str | None,
                coalesce: bool) -> LoadedProgram:
        """:meth:`load` of an accepted program."""
        with self.communicating():
            backend = self.channel(channel)
            try:
                backend.prepare(prog)
            except (ReshardError, ExecutionError):
                raise
            except Exception as e:
                raise ExecutionError(
                    f"device {self.device}: setting up communicators failed: "
                    f"{type(e).__name__}: {e}") from e
        src_box = {i: t.src_box for i, t in enumerate(prog.tensors) if t.src_box is not None}
        dst_box = {i: t.dst_box for i, t in enumerate(prog.tensors) if t.dst_box is not None}
        steps, need = program_steps(prog, self.capabilities.fuses_sums, coalesce,
                                    self.capabilities.all_reduces)
        if self.memory_budget is not None and need > self.memory_budget:
            raise ReshardError(
                f"device {self.device}: the program stages {need} bytes in its fullest "
                f"step, over this executor's memory_budget of {self.memory_budget}; plan "
                f"it with memory_budget={self.memory_budget} (plan_many / load_request)")
        scratch = backend.empty(need, np.uint8)
        return LoadedProgram(prog, steps, src_box, dst_box, scratch, backend, self.capabilities)

    def load_request(self, requests: Sequence[tuple], cluster: Cluster, *,
                     strategy: str | Strategy = Strategy.BROADCAST,
                     world: Sequence[int] | None = None, channel: str | None = None,
                     verify: bool = False) -> tuple[LoadedProgram, tuple[TensorSpec, ...]]:
        """SPMD: plan ``requests`` (:func:`reshard.plan_many`'s ``(shape, dtype, src,
        dst[, cast])`` each) on this rank, agree with every rank of ``world`` (default:
        the backend's world) on the plan's digest, and load only this device's program
        (:mod:`reshard.comm.spmd`; the plan's tasks are dropped). Every rank of
        ``world`` calls it with the same request, in one order; ranks given different
        requests or running different reshard versions all raise one PlanError naming
        them, before any byte moves. The rank checks its own program; ``verify`` also
        verifies the whole plan (about ten times the cost of cutting the program).
        Returns the loaded program and the plan's tensors (the requests, then any a
        scaled cast adds)::

            loaded, tensors = ex.load_request([(shape, "bfloat16", src, dst)], cluster)
            dst = ex.run(loaded, [my_src_shard]).wait()
        """
        backend = self.channel(channel)
        members = world_of(backend, world)
        local = LocalPlan(requests, cluster, self.device, strategy, verify,
                          self.memory_budget, members, channel)
        try:
            with self.communicating():
                rows = exchange(backend, members, local.record)
        except ExecutionError as e:
            raise PlanError(
                f"device {self.device}: the ranks' plan records could not be exchanged "
                f"({local.where}): {e}; a rank given another world or channel fails so: "
                f"give every rank the same world= (in one order) and channel=") from e
        # every rank saw the same records: a disagreement is refused on all of them
        # alike, and the executor stays usable
        program = local.program(members, rows, self.capabilities.groups_need_world)
        # (local.program checked it: cut here, it needs no second check)
        return self._loaded(self._accepted(program), channel, True), local.tensors

    # ----- running -----------------------------------------------------------------------
    def _sources(self, lp: LoadedProgram, given: dict[int, Any]) -> dict[int, Any]:
        """``given`` (the caller's source shards by tensor index) checked against the
        program."""
        tensors = lp.program.tensors
        out = {}
        for i, box in lp.src_box.items():
            if tensors[i].derive is not Derive.NONE:
                continue  # computed on the way (Execution.source)
            if i not in given:
                raise ReshardError(
                    f"device {self.device} holds a source shard of tensor {i} (box {box} of "
                    f"{tensors[i].shape}) but none was given; pass it in sources[{i}]")
            out[i] = self._checked(given[i], lp.src_shape(i), tensors[i].dtype,
                                   f"source shard of tensor {i}")
        return out

    def _outputs(self, lp: LoadedProgram, given: dict[int, Any]) -> dict[int, Any]:
        """The destination shards: the caller's ``given`` buffers by tensor index,
        checked, and the rest allocated."""
        tensors = lp.program.tensors
        extra = sorted(set(given) - set(lp.dst_box))
        if extra:
            raise ReshardError(f"out: device {self.device} holds no destination shard of "
                               f"tensors {extra}; pass None for them")
        dst = {}
        for i in lp.dst_box:
            shape, dt = lp.dst_shape(i), tensors[i].out_dtype
            if i in given:
                buf = self._checked(given[i], shape, dt, f"out buffer of tensor {i}")
                if math.prod(shape) and not same_memory(buf, given[i]):
                    raise ReshardError(
                        f"out buffer of tensor {i} ({type(given[i]).__name__}) cannot be "
                        f"written in place by the {self.backend.name} backend (it would be "
                        f"copied); pass a {type(buf).__name__} on its device")
            else:
                buf = lp.backend.empty(math.prod(shape), parse_dtype(dt)).reshape(shape)
            if tensors[i].dst_fill:
                buf[...] = 0
            dst[i] = buf
        return dst

    def _checked(self, array: Any, shape: tuple[int, ...], dtype: str, what: str) -> Any:
        arr = self.backend.asarray(array)
        held = _dtype_name(arr)
        as_bits = dtype in self.capabilities.bits and held == storage(dtype)
        if tuple(arr.shape) != shape or (held != dtype and not as_bits):
            raise ShapeError(
                f"device {self.device}: {what} has shape {tuple(arr.shape)} and dtype "
                f"{_dtype_name(arr)}; the plan needs shape {shape} and dtype {dtype}")
        return arr

    def run(self, loaded: LoadedProgram, sources: Shards | None = None,
            out: Shards | None = None, *, blocking: bool = True) -> Handle:
        """Run a loaded program on this device's shards.

        Args:
            loaded: from :meth:`load`.
            sources: this device's source shard per tensor (module docstring), or per
                input tensor (a scaled cast's amax and scales are derived here); read,
                never written.
            out: buffers for this device's destination shards (the shard's shape and
                dtype, on the backend's device); missing ones are allocated.
            blocking: issue the steps on this thread (the returned handle is done) or
                on the executor's issue thread.

        Returns:
            A :class:`Handle`; ``wait()`` gives ``{tensor index: destination shard}``.
        """
        if not isinstance(loaded, LoadedProgram):
            raise ReshardError(f"run() takes what load() returned, got {type(loaded).__name__}")
        if loaded.device != self.device:
            raise ReshardError(f"program of device {loaded.device} given to the executor of "
                               f"device {self.device}")
        self._check_usable("run")
        tensors = loaded.program.tensors
        inputs = [i for i, t in enumerate(tensors) if t.derive is Derive.NONE]
        given_src = _per_tensor(sources, len(tensors), "sources", inputs)
        src = self._sources(loaded, given_src)
        given_out = _per_tensor(out, len(tensors), "out")
        dst = self._outputs(loaded, given_out)
        torch_caller = self.arrays == "torch" or any(
            is_torch(a) for a in (*given_out.values(), *given_src.values()))
        shown = _as_given(dst, given_out, torch_caller)
        if blocking:
            return Handle(loaded, _done(self._execute(loaded, src, dst)), shown)
        if self._issuer is None:
            self._issuer = ThreadPoolExecutor(1, thread_name_prefix=f"reshard-exec{self.device}")
        return Handle(loaded, self._issuer.submit(self._execute, loaded, src, dst), shown)

    def _execute(self, lp: LoadedProgram, src: dict[int, Any],
                 dst: dict[int, Any]) -> tuple[dict[int, Any], int]:
        # the cyclic collector paused: a step of many small tasks allocates thousands of
        # short-lived objects (freed by reference counting), whose collector passes over
        # the worker's heap cost a few % of a coalesced execute and find nothing
        with self.communicating(), paused():
            lp.backend.activate()  # e.g. make the GPU current in this thread
            if lp.backend.capabilities.sized_pieces:  # the piece its plan's model charges
                lp.backend.use_piece(lp.program.piece)  # type: ignore[attr-defined]
            sent = Execution(lp, dict(src), dst).run(self._blame)
            self._current = None
        return dst, sent

    def execute(self, plan: ReshardPlan | WorkerProgram, sources: Shards | None = None,
                out: Shards | None = None) -> dict[int, Any]:
        """Load ``plan``, run it once and wait: ``{tensor index: destination shard}``
        (load once and :meth:`run` to reuse its communicators and scratch)."""
        return self.run(self.load(plan), sources, out).wait()

    def close(self) -> None:
        """Stop the issue thread; close the channels and, if this executor made it, the
        backend (a torch backend never destroys the caller's process group)."""
        if self._issuer is not None:
            self._issuer.shutdown(wait=True)
            self._issuer = None
        for b in self.channels.values():
            b.close()
        self.channels.clear()
        if self._owns:
            self.backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Executor", "Handle", "LoadedProgram", "Shards", "WorkerProgram"]

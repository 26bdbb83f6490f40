"""The Backend protocol every data plane implements, and backends registered by name.

A backend instance serves one device (one rank). Collectives name their member set
as a sorted tuple of global device ids (the communicator key); rows of an all-gather
follow that order. Buffers are 1-d contiguous arrays of the backend's array module
(numpy for ``local``, ``gloo``, ``tcp`` and ``torch`` on CPU, cupy for ``nccl``, torch tensors
for ``torch`` on CUDA).

Registration: a :class:`BackendRegistry` is an immutable value mapping names to
:class:`BackendEntry` (a factory and the :class:`Capabilities` it declares up front).
:func:`builtin_backends` returns the built-ins; :func:`register_backend` returns a
new registry with one more entry, which the caller hands to whatever builds backends
by name (``Runtime(registry=...)``, ``Executor.create(name, registry=...)``, the
DTensor adapter). Nothing is registered process-wide: two callers in one process may
give one name different backends, a test's registration cannot leak into another,
and reading a registry needs no lock.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, runtime_checkable

from reshard.core.choice import parse_choice
from reshard.core.dtypes import ReduceOp, accumulator, why_not_summable
from reshard.core.errors import DTypeError, OptionError, ReshardError
from reshard.planner.values.tasks import SUMMING, Conversion, Task

Devices: TypeAlias = Sequence[int]
"""Global device ids: a collective's member set, a broadcast's chain or tree parents."""
Landed: TypeAlias = Callable[[int], None]
"""A receiver's progress callback: told the bytes of its buffer filled so far
(:attr:`Capabilities.lands_pieces`)."""


class BackendKind(enum.Enum):
    """The built-in data planes a :class:`reshard.Runtime` starts workers for: the
    entries of :func:`builtin_backends` that have launchers (a test holds them equal)."""

    LOCAL = "local"
    GLOO = "gloo"
    NCCL = "nccl"
    TCP = "tcp"
    NIXL = "nixl"

    @classmethod
    def parse(cls, value: str | BackendKind) -> BackendKind:
        """Accept a BackendKind or its name; raise listing the valid names."""
        return parse_choice(cls, value, "backend")

    @property
    def advertises(self) -> bool:
        """Its ranks talk over the host's network and are told the address the others
        reach them at (the registry's :attr:`BackendEntry.advertises`)."""
        return builtin_backends().entry(self.value).advertises

    @property
    def entry(self) -> BackendEntry:
        """Its entry of :func:`builtin_backends` (the one table of the built-ins)."""
        return builtin_backends().entry(self.value)


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, declared up front (as torch's ``register_backend``
    declares its devices): callers read this, they never probe with getattr.

    Attributes:
        moves: dtype names the backend moves; None for every dtype of
            :data:`reshard.core.dtypes.DTYPES`.
        sums: dtype names its reduce can combine (sum, and max for an amax); a partial
            sum reduces in its accumulator (:func:`reshard.core.dtypes.accumulator`: bf16 and
            fp16 in float32), which must be among them. None: every accumulator.
        groups_need_world: collective communicators are created by every rank of the
            world, members or not (gloo's ``new_group``): every worker must load every
            plan, in one order. False: only a plan's devices load it.
        device: where buffers live: ``"cpu"`` (host memory) or ``"cuda"`` (a GPU).
        fuses_sums: :meth:`Backend.broadcast` sums its ``addends`` on the way,
            pipelined (a plan's broadcast of a partial sum). False: the executor runs
            such a task as a reduction, then a broadcast of the sum, and never passes
            ``addends`` (the backend refuses them, :func:`refuse_unsupported`).
        lands_pieces: :meth:`Backend.broadcast` and :meth:`Backend.recv` call their
            ``landed``, on a receiver, with the bytes of its ``buf`` filled so far
            (from its start) as pieces arrive, so the executor copies a box received
            into scratch memory into place while the rest arrives. False: it copies
            after the step, and never passes ``landed`` (refused likewise).
        converts: dtype names its buffers convert between (a cast on the wire, a
            partial sum into and out of its accumulator); None: every dtype
            (:mod:`reshard.core.casting` on numpy or torch buffers).
        bits: dtype names its array library lacks, so its buffers hold them as unsigned
            integers of the same width (:func:`reshard.core.dtypes.storage`): the caller's
            arrays of such a tensor may be of either type, and the bits move unchanged.
        sized_pieces: the backend pipelines in pieces of a size it is told: the
            executor calls its ``use_piece(nbytes)`` before running a program, with the
            program's piece (its plan's ``Cluster.relay_piece``, which the cost model
            charges each relay for; 0: the backend's own). False: never called.
        batch_scheduled: the worker processes the process and Ray launchers start for
            it run under Linux's ``SCHED_BATCH`` policy (no preemption on wake-up;
            :mod:`reshard.comm.launchers.scheduling` says why gloo asks). Never applied
            to a process the caller owns (the embeddable executor, the thread launcher).
        gathers: :meth:`Backend.send`, :meth:`Backend.recv` and
            :meth:`Backend.broadcast` also take ``buf`` as a list of 1-d C-contiguous
            arrays (of any dtypes) or flat byte memoryviews of host memory, moved as
            the concatenation of their bytes, and the
            members of one operation may cut it differently (same total): a sender
            gathers from where each box lies, a receiver scatters to where each goes
            (``sendmsg`` / ``recvmsg_into``). The executor then moves a coalesced
            message's boxes that are contiguous in their shard straight from and into
            the shard instead of through scratch memory. False: ``buf`` is one array.
        all_reduces: it is also an :class:`AllReducing` backend: its ``all_reduce``
            runs a plan's ``ALLREDUCE`` tasks in one operation (gloo's and NCCL's
            ring). False: the executor runs each as a reduction into the first member,
            then a broadcast of the sum (:func:`reshard.planner.values.tasks.allreduce_parts`),
            and never calls ``all_reduce``.
    """

    moves: frozenset[str] | None
    sums: frozenset[str] | None
    groups_need_world: bool
    device: str
    fuses_sums: bool = False
    lands_pieces: bool = False
    converts: frozenset[str] | None = None
    bits: frozenset[str] = frozenset()
    sized_pieces: bool = False
    batch_scheduled: bool = False
    gathers: bool = False
    all_reduces: bool = False

    def meet(self, rank: Capabilities) -> Capabilities:
        """What a rank built from a registration declaring ``self`` may be asked to do,
        when the rank declares ``rank`` itself: the dtypes both allow, communicators
        made world-wide if either says so, buffers where the rank has them, sums fused
        only if both fuse them (and report landed pieces, take a piece size, ask for
        batch scheduling, gather buffers and all-reduce, only if both do)."""
        def both(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
            return b if a is None else a if b is None else a & b

        return Capabilities(both(self.moves, rank.moves), both(self.sums, rank.sums),
                            self.groups_need_world or rank.groups_need_world, rank.device,
                            self.fuses_sums and rank.fuses_sums,
                            self.lands_pieces and rank.lands_pieces,
                            both(self.converts, rank.converts), self.bits | rank.bits,
                            self.sized_pieces and rank.sized_pieces,
                            self.batch_scheduled and rank.batch_scheduled,
                            self.gathers and rank.gathers,
                            self.all_reduces and rank.all_reduces)


@runtime_checkable
class Backend(Protocol):
    """Point-to-point and collective operations of one rank.

    Every blocking operation honours the backend's timeout and raises
    :class:`reshard.ExecutionError` naming the peer(s) when it expires.
    """

    name: str
    """The name it is registered under (for messages)."""
    capabilities: Capabilities
    """What it can do (a class attribute, or set per instance by a backend whose
    abilities depend on what it wraps, e.g. the process group of ``torch``)."""
    device: int
    """The global device id this rank serves."""

    @property
    def world(self) -> tuple[int, ...] | None:
        """The devices of every rank this one can reach, in rank order (a process
        group's ranks); None where any device of a shared fabric can take part (the
        ``local`` backend's threads): ranks that plan for themselves then name theirs
        (:meth:`reshard.comm.executor.Executor.load_request`'s ``world=``)."""

    def prepare(self, plan: Any) -> None:
        """Create the communicators ``plan`` needs that this rank lacks (run before
        every plan load, on the workers :attr:`Capabilities.groups_need_world` names).
        ``plan`` is anything with ``communicator_groups()``: a ReshardPlan or a
        :class:`~reshard.comm.program.WorkerProgram`."""

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

    def broadcast(self, buf: Any, root: int, group: Devices, chain: Devices | None = None,
                  *, tag: int = 0, parents: Devices | None = None, addends: Devices = (),
                  addend_parents: Devices | None = None, landed: Landed | None = None) -> None:
        """Send ``buf`` from ``root`` to every member of ``group`` (in place).
        ``chain`` is the plan's order of the receivers (root's host first), and
        ``parents`` (a tree plan's) the member each of them receives from, for
        backends that pipeline a chain or tree themselves; ``tag`` as for
        :meth:`send`. The result is the same with or without them.

        ``addends`` (only where ``capabilities.fuses_sums``; else refused): devices of
        ``group`` whose ``buf`` (each its own addend) is summed, down the chain
        ``addends[0] -> ... -> root`` (or up the tree ``addend_parents`` gives: one
        parent per addend, the root or another addend), into the root's ``buf`` (which
        starts as the root's addend) while the sum goes on to the receivers;
        afterwards the root's and the receivers' ``buf`` hold the sum (an addend's
        holds a partial sum).
        ``landed`` (on receivers, only where ``capabilities.lands_pieces``; else
        refused): see :class:`Capabilities`."""

    def send(self, buf: Any, peer: int, *, tag: int = 0) -> None:
        """Send ``buf`` to ``peer``.

        ``tag`` (the worker passes the task's index in the plan): operations of one
        group between the same pair of ranks are matched by tag, so they may be
        issued and complete in any order. A backend whose operations are matched in
        issue order (every rank issues them in the plan's one global order) may
        ignore it."""

    def recv(self, buf: Any, peer: int, *, tag: int = 0, landed: Landed | None = None) -> None:
        """Receive from ``peer`` into ``buf`` (the send with the same ``tag``);
        ``landed`` as for :meth:`broadcast` (only where ``capabilities.lands_pieces``)."""

    def all_gather(self, out: Any, inp: Any, group: Sequence[int]) -> None:
        """``out[i] = inp of group[i]`` on every member; ``out`` is (len(group), n)."""

    def reduce(self, buf: Any, root: int, group: Sequence[int], *,
               op: ReduceOp = ReduceOp.SUM) -> None:
        """Combine every member's ``buf`` into ``root``'s ``buf`` with ``op`` (a sum, or
        the elementwise max of a scaled cast's amax)."""

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




@runtime_checkable
class AllReducing(Protocol):
    """The operation a backend declaring ``Capabilities.all_reduces`` adds to
    :class:`Backend`."""

    def all_reduce(self, buf: Any, group: Sequence[int], *,
                   op: ReduceOp = ReduceOp.SUM) -> None:
        """Combine every member's ``buf`` with ``op`` into every member's ``buf`` (in
        place; every member ends with the same bits)."""


def refuse_unsupported(backend: str, caps: Capabilities, addends: Devices = (),
                       landed: Landed | None = None) -> None:
    """Raise if a caller passed :meth:`Backend.broadcast` / :meth:`Backend.recv` an
    argument that ``caps`` does not declare (the executor never does: a plan's fused
    sums are split for such backends, and landed pieces not asked for)."""
    if addends and not caps.fuses_sums:
        raise ReshardError(f"the {backend} backend does not sum addends on the way "
                           f"(Capabilities.fuses_sums); run the reduction, then broadcast")
    if landed is not None and not caps.lands_pieces:
        raise ReshardError(f"the {backend} backend does not report landed pieces "
                           f"(Capabilities.lands_pieces)")


def check_dtypes(tensors: Sequence[Conversion], tasks: Iterable[Task], caps: Capabilities,
                 name: str) -> None:
    """Refuse, before anything moves, a dtype the backend cannot move, a partial sum
    it cannot reduce and a conversion it cannot make (the dtype policy,
    :mod:`reshard.core.dtypes`, applied to one backend's capabilities).

    Args:
        tensors: the plan's (or program's) tensors.
        tasks: its tasks (those that reduce a tensor make it a partial sum to sum).
        caps: what the backend can do.
        name: the backend's name, for messages.

    Raises:
        DTypeError: naming the tensor, the dtype and what the backend supports.
    """
    reduced = {t.tensor for t in tasks if t.kind in SUMMING or t.addends}
    for i, t in enumerate(tensors):
        what = f"tensor {i} ({t.shape} {t.dtype})"
        for dt in dict.fromkeys((t.dtype, t.out_dtype)):
            if caps.moves is not None and dt not in caps.moves:
                raise DTypeError(f"the {name} backend cannot move dtype {dt} ({what}); it "
                                 f"moves {sorted(caps.moves)}")
        converted = {t.dtype, t.out_dtype} if t.out_dtype != t.dtype else set()
        if i in reduced:
            acc = accumulator(t.dtype)
            if acc is None:
                raise DTypeError(f"{what} is a partial sum, but {why_not_summable(t.dtype)}")
            if caps.sums is not None and acc not in caps.sums:
                raise DTypeError(
                    f"the {name} backend cannot sum {acc} (how {t.dtype} partial sums "
                    f"accumulate), and {what} is a partial sum to reduce; it sums "
                    f"{sorted(caps.sums)}: reduce on another backend (e.g. 'gloo', 'local'), "
                    f"or convert the addends to one of those")
            if acc != t.dtype:
                converted |= {t.dtype, acc}
        lacking = sorted(converted - caps.converts) if caps.converts is not None else []
        if lacking:
            raise DTypeError(
                f"the {name} backend cannot convert {lacking} ({what}, delivered as "
                f"{t.out_dtype}{', summed in ' + str(accumulator(t.dtype)) if i in reduced else ''}); "
                f"it converts {sorted(caps.converts or ())}: cast elsewhere (e.g. the 'gloo' or "
                f"'torch' backend), or move the tensor in its own dtype")


Factory = str | Callable[..., Backend]
"""A backend factory: a callable returning a rank, or its ``"package.module:name"``
path (imported only when a rank is built, so torch and cupy load only there)."""


@dataclass(frozen=True)
class BackendEntry:
    """A backend registered by name.

    Attributes:
        name: the registered name (lower case).
        factory: builds one rank; its arguments are the backend's own (the built-ins
            started by a Runtime take ``(device, world, rendezvous, timeout, **options)``,
            ``torch`` takes an existing process group).
        capabilities: what its ranks can do, declared before any is built.
        launchers: the reshard launchers that can start its ranks, preferred first
            (:class:`reshard.comm.launchers.LauncherKind` values); empty for a
            backend that runs only inside processes the caller owns (through
            :class:`reshard.comm.executor.Executor`).
        preload: modules a process launcher's fork server imports once before it
            forks the ranks (what a rank imports; nothing that starts CUDA).
        advertises: its ranks talk over the host's network and are told the address
            the others reach them at (``advertise=``; loopback, a Ray node's, a
            testbed namespace's).
        requires: ``"package.module:function"`` saying why it cannot run on this
            machine (a missing package, no GPU) or None, asked before anything starts;
            empty: it always can.
        keyed: its ranks authenticate their connections with the run's ``link_key=``
            (:mod:`reshard.comm.bootstrap.link_key`), which reshard's launchers make once per run.
        summary: what it is, in a few words (command lines' ``--help``).
    """

    name: str
    factory: Factory
    capabilities: Capabilities
    launchers: tuple[str, ...] = ()
    preload: tuple[str, ...] = ()
    advertises: bool = False
    requires: str = ""
    keyed: bool = False
    summary: str = ""

    def problem(self) -> str | None:
        """Why it cannot run on this machine, or None (:attr:`requires`)."""
        if not self.requires:
            return None
        module, _, attr = self.requires.partition(":")
        check: Callable[[], str | None] = getattr(importlib.import_module(module), attr)
        return check()

    def load(self) -> Callable[..., Backend]:
        """The factory as a callable (imports its module when given as a path)."""
        if not isinstance(self.factory, str):
            return self.factory
        module, _, attr = self.factory.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
        except (ImportError, AttributeError) as e:
            raise ReshardError(
                f"backend {self.name!r}: cannot import its factory {self.factory!r} "
                f"({type(e).__name__}: {e}); register it as 'package.module:callable' or "
                f"pass the callable itself") from None

    def create(self, *args: Any, **kwargs: Any) -> Backend:
        """One rank: ``factory(*args, **kwargs)``, checked to be a :class:`Backend`."""
        rank = self.load()(*args, **kwargs)
        if not isinstance(rank, Backend):
            raise ReshardError(
                f"backend {self.name!r}: its factory returned a {type(rank).__name__}, which "
                f"lacks methods of the Backend protocol (reshard.comm.backend.Backend); "
                f"return an object implementing all of them")
        return rank


def _entry_name(name: object) -> str:
    if isinstance(name, BackendKind):
        return name.value
    if not isinstance(name, str) or not name.strip():
        raise OptionError(f"a backend name must be a non-empty string, got {name!r}")
    return name.strip().lower()


@dataclass(frozen=True)
class BackendRegistry:
    """Backends by name: an immutable value (see the module docstring for why).

    Attributes:
        entries: the entries, in registration order; names are unique.
    """

    entries: tuple[BackendEntry, ...] = ()

    def __post_init__(self) -> None:
        names = [e.name for e in self.entries]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ReshardError(f"backend names must be unique in a registry, got {dup} twice")

    @property
    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(e.name for e in self.entries)

    def entry(self, name: str | BackendKind) -> BackendEntry:
        """The entry registered as ``name`` (case-insensitive).

        Raises:
            OptionError: no such backend; the message lists the registered names.
        """
        key = _entry_name(name)
        for e in self.entries:
            if e.name == key:
                return e
        raise OptionError(f"unknown backend {name!r}; valid backends: {list(self.names)}")

    def __contains__(self, name: object) -> bool:
        return any(e.name == _entry_name(name) for e in self.entries) if isinstance(
            name, (str, BackendKind)) else False

    def register(self, name: str, factory: Factory, capabilities: Capabilities, *,
                 launchers: Sequence[str] = (), replace: bool = False) -> BackendRegistry:
        """A new registry with ``name`` added (this one is unchanged).

        Args:
            name: the name to build it by.
            factory: see :class:`BackendEntry`.
            capabilities: what its ranks can do.
            launchers: see :class:`BackendEntry` (built-ins only; user backends run
                embedded).
            replace: allow replacing an entry of the same name.

        Raises:
            ReshardError: ``name`` is taken and ``replace`` is false, or the factory or
                capabilities are of the wrong type.
        """
        key = _entry_name(name)
        if launchers and key not in {k.value for k in BackendKind}:
            raise ReshardError(
                f"backend {key!r}: a registered backend runs inside processes the caller "
                f"owns (reshard.Executor); only the built-ins {[k.value for k in BackendKind]} "
                f"are started by reshard's launchers: register it without launchers")
        if not isinstance(capabilities, Capabilities):
            raise ReshardError(
                f"backend {key!r}: capabilities must be a reshard.comm.backend.Capabilities, "
                f"got {type(capabilities).__name__}; declare what the backend can do")
        if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
            raise ReshardError(
                f"backend {key!r}: factory must be a callable or 'package.module:callable', "
                f"got {factory!r}")
        if key in self and not replace:
            raise ReshardError(
                f"backend {key!r} is already registered ({self.entry(key).factory!r}); pass "
                f"replace=True to replace it, or choose another name")
        entry = BackendEntry(key, factory, capabilities, tuple(launchers))
        return BackendRegistry((*(e for e in self.entries if e.name != key), entry))

    def create(self, name: str | BackendKind, *args: Any, **kwargs: Any) -> Backend:
        """Build one rank of backend ``name`` (arguments: the backend's factory's)."""
        return self.entry(name).create(*args, **kwargs)


_LOOP = "reshard.comm.launchers.worker_loop"
_NEEDS = "reshard.comm.backends.requirements:"
_AT = "reshard.comm.backends."


def _declared(path: str) -> Capabilities:
    """The capabilities the class at ``path`` (``"package.module:Class"``) declares; the
    built-ins' modules import no torch or cupy until a rank is built."""
    module, _, cls = path.partition(":")
    caps: Capabilities = getattr(importlib.import_module(module), cls).capabilities
    return caps


def builtin_backends() -> BackendRegistry:
    """A registry of the built-in backends: ``local``, ``gloo``, ``nccl``, ``tcp``,
    ``nixl`` (started by a Runtime) and ``torch`` (ranks of a torch.distributed process group the
    caller made; embedded only). Each call returns a new value; extend it with
    :meth:`BackendRegistry.register` or :func:`register_backend` (a registered backend
    runs embedded, through :class:`reshard.comm.executor.Executor`: reshard's launchers
    and :class:`reshard.Runtime` start the built-ins only).

    Its rows are the one table of the built-ins: every list of backends (``BackendKind``,
    the benchmarks' and the service's choices and help, the process launcher's preloads)
    derives from them (``tests/unit/test_backend_registry.py``)."""
    local, gloo, nccl = _AT + "local:LocalBackend", _AT + "gloo:GlooBackend", _AT + "nccl:NcclBackend"
    tcp, nixl = _AT + "tcp:TcpBackend", _AT + "nixl:NixlBackend"
    return BackendRegistry((
        BackendEntry(name="local", summary="in-process reference: threads, numpy",
                     factory=local, capabilities=_declared(local), launchers=("thread",)),
        BackendEntry(name="gloo", summary="CPU processes, torch.distributed's gloo",
                     factory=gloo, capabilities=_declared(gloo), launchers=("process", "ray"),
                     preload=(_LOOP, _AT + "gloo", "torch.distributed"), advertises=True,
                     requires=_NEEDS + "needs_torch"),
        BackendEntry(name="nccl", summary="GPUs, NCCL through cupy",
                     factory=nccl, capabilities=_declared(nccl), launchers=("process", "ray"),
                     preload=(_LOOP,), requires=_NEEDS + "needs_gpu"),
        BackendEntry(name="torch", summary="ranks of a torch.distributed process group the "
                     "caller made (embedded only)", factory=_AT + "torch_dist:torch_backend",
                     capabilities=_declared(_AT + "torch_dist:TorchDistBackend")),
        BackendEntry(name="tcp", summary="CPU processes, scatter / gather sockets",
                     factory=tcp, capabilities=_declared(tcp), launchers=("process", "ray"),
                     preload=(_LOOP, _AT + "tcp"), advertises=True, keyed=True),
        BackendEntry(name="nixl", summary="CPU processes, NIXL one-sided WRITEs over UCX",
                     factory=nixl, capabilities=_declared(nixl), launchers=("process", "ray"),
                     preload=(_LOOP, _AT + "nixl"), advertises=True, keyed=True,
                     requires=_NEEDS + "needs_nixl"),
    ))


def register_backend(name: str, factory: Factory, capabilities: Capabilities, *,
                     registry: BackendRegistry | None = None,
                     replace: bool = False) -> BackendRegistry:
    """``registry`` (default: :func:`builtin_backends`) with backend ``name`` added.

    As torch's ``register_backend(name, func, devices=...)``, the capabilities are
    declared when registering, before any rank exists; unlike it, nothing changes
    process-wide: pass the returned registry to what builds backends by name.

    Args:
        name: the name.
        factory: a callable building one rank, or its ``"package.module:callable"``.
        capabilities: dtypes it moves and sums, whether its communicators need every
            rank of the world, where its buffers live.
        registry: the registry to extend.
        replace: allow replacing an entry (a built-in included).

    Returns:
        The new registry.
    """
    base = builtin_backends() if registry is None else registry
    return base.register(name, factory, capabilities, replace=replace)


def backend_class(kind: str | BackendKind) -> type:
    """The class implementing built-in ``kind`` (imports its module now)."""
    entry = builtin_backends().entry(BackendKind.parse(kind))
    factory = entry.load()
    if not isinstance(factory, type):
        raise ReshardError(f"backend {entry.name!r} is built by a function, not a class")
    return factory


__all__ = ["Backend", "BackendEntry", "BackendKind", "BackendRegistry", "Capabilities",
           "Factory", "backend_class", "builtin_backends", "check_dtypes",
           "refuse_unsupported", "register_backend"]

"""DTensor redistribute across device meshes, through reshard plans.

torch's ``DTensor.redistribute`` moves a tensor between placements of one mesh; to
another mesh it raises ``NotImplementedError("Cross device mesh comm not supported
yet!")``. :func:`redistribute` does that move::

    y = redistribute(x, infer_mesh, [Replicate(), Shard(1)])   # x lives on train_mesh

It is a collective over the default process group: every rank calls it, with the same
arguments, in the same order as its other redistributes (as with any torch collective).
The source and destination meshes may be disjoint or overlap; ``Partial("sum")``
sources are summed on the way; uneven shapes follow DTensor's own placement rule
(``reshard.adapters.dtensor.to_layout``). The result is a DTensor on ``device_mesh``
with ``placements``; a rank outside that mesh gets what DTensor gives non-members (an
empty local tensor). The result is outside autograd; it is a new tensor, except where
a rank's part of the move is only a copy within it of a contiguous slice (DTensor's
``Replicate -> Shard(0)``): there, as DTensor's own result, a view of the source's local
tensor.

:func:`redistribute_many` moves a whole state dict with one plan (``plan_many``: one
load balance and one task order for all tensors), the RL weight-sync case.

Every rank plans for itself (SPMD, :meth:`reshard.comm.executor.Executor.load_request`)
and keeps only its own program; before the first byte moves the ranks compare the plan's
digest in one small all-gather, so a rank given other tensors, or running another
reshard version, raises a PlanError on every rank instead of hanging. Plans are cached
per (shapes, dtypes, layouts, strategy), with this rank's program loaded (communicators
made, scratch allocated): a repeated call costs only the transfer. The cache, the
executor and the sub-groups live in a :class:`Redistributor`. Pass one explicitly
(``redistributor=``) to control its cluster, backend, timeout and lifetime; otherwise
the calls share a default one, kept in a :mod:`contextvars` context variable (the
standard library's mechanism for implicit per-thread context, as ``decimal`` keeps its
context) and bound to the default process group it was made for: once that group is
destroyed, the next call makes a new one. Nothing is stored at module level, and no
state outlives the process group it belongs to.

Hosts: plans balance transfers per host NIC. By default the Redistributor learns each
rank's host from one ``all_gather_object`` of host names, on its first call; pass
``cluster=`` (a :class:`reshard.Cluster` over the global ranks) to give link figures.

dtypes: every dtype of :mod:`reshard.core.dtypes` is first class (``torch.bfloat16`` and
the float8 kinds included): a ``Partial`` bfloat16 / float16 source sums in float32
and rounds once; ``cast=`` (and ``scale=`` for float8) converts on the way, at the
source, and then the result is ``(values, scales)``. A torch dtype outside that list
moves as raw bits of its width (never summed, never cast).
"""

from __future__ import annotations

import contextvars
import datetime
import socket
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from reshard.adapters.dtensor_layout import to_layout, to_placements
from reshard.comm.backend import BackendRegistry
from reshard.comm.engine.packing import local_slices
from reshard.comm.engine.steps import LoadedProgram
from reshard.comm.executor import Executor
from reshard.core.cluster import Cluster
from reshard.core.dtypes import DTYPES, Cast, ScaleMode, parse_dtype
from reshard.core.errors import DTypeError, ExecutionError, ReshardError, ShapeError
from reshard.core.layout import Layout
from reshard.core.lru import LruCache
from reshard.planner.schedule.staging import check_budget
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import TaskKind, TensorSpec, output_indices

__all__ = ["Redistributor", "default_redistributor", "redistribute", "redistribute_many"]

DEFAULT_MAX_PLANS = 64
"""Plans (with their loaded programs and scratch buffers) a Redistributor keeps."""

_CURRENT: contextvars.ContextVar[Redistributor | None] = contextvars.ContextVar(
    "reshard_redistributor", default=None)


@dataclass(frozen=True)
class _Move:
    """One tensor of a call: what the plan needs and how its bytes are viewed.

    Attributes:
        shape: the global shape.
        dtype: the plan's dtype name (:mod:`reshard.core.dtypes`).
        bits: the torch dtype to view the tensor as (None: its own dtype moves).
        src: the source layout.
        dst: the destination layout.
        cast: the conversion on the way (None: none).
    """

    shape: tuple[int, ...]
    dtype: str
    bits: torch.dtype | None
    src: Layout
    dst: Layout
    cast: Cast | None = None

    @property
    def request(self) -> tuple:
        """What :func:`reshard.plan_many` takes."""
        return (self.shape, self.dtype, self.src, self.dst, self.cast)


def _plan_dtype(dtype: torch.dtype, partial: bool, cast: Cast | None,
                name: str) -> tuple[str, torch.dtype | None]:
    """The dtype name a plan moves ``dtype`` as, and the torch dtype to view the tensor
    as when reshard has no such type (its raw bits: moved, never summed or cast)."""
    try:
        return parse_dtype(dtype).name, None
    except DTypeError:
        pass
    text = str(dtype).removeprefix("torch.")
    width = torch.empty((), dtype=dtype).element_size()
    bits = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.int64}.get(width)
    if bits is None or partial or cast is not None:
        why = (f"a Partial source must be summed, and reshard has no {text}" if partial
               else f"reshard cannot cast a {text}" if cast is not None
               else f"no {8 * width}-bit integer carries its bits")
        raise DTypeError(
            f"{name}: cannot redistribute a {text} DTensor ({why}); cast it to one of "
            f"{list(DTYPES)} first, or reduce it on its own mesh (placements without "
            f"Partial)")
    return str(bits).removeprefix("torch."), bits


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    stride, acc = [], 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(stride))


class Redistributor:
    """Cross-mesh redistribution on one process group: executor, plan cache, cluster.

    Every rank of the group makes its own and calls it collectively.

    Args:
        group: the process group holding every rank (default: the default group).
        cluster: hosts and links over the global ranks; default: the ranks' host names
            gathered once (see the module docstring).
        backend: the registered backend to run on (default ``"torch"``; it is built as
            ``factory(group, timeout=..., buffers=...)``).
        registry: where ``backend`` is registered (default: the built-ins).
        timeout: seconds communicator set-up and each wait may take.
        max_plans: plans kept loaded; beyond it the least recently used goes.
        memory_budget: the most bytes of staging (scratch) a plan may hold on a rank;
            plans are made within it (:func:`reshard.planner.schedule.staging.fit_budget`).
    """

    def __init__(self, group: Any = None, *, cluster: Cluster | None = None,
                 backend: str = "torch", registry: BackendRegistry | None = None,
                 timeout: float = 60.0, max_plans: int = DEFAULT_MAX_PLANS,
                 memory_budget: int | None = None) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ReshardError(
                "redistribute is a collective over torch.distributed, which this process "
                "has not initialised; call torch.distributed.init_process_group(...) first")
        if isinstance(max_plans, bool) or not isinstance(max_plans, int) or max_plans < 1:
            raise ReshardError(f"max_plans must be an integer >= 1, got {max_plans!r}")
        self.group = group
        self.world_group = dist.group.WORLD  # the default group this one belongs to
        self.cluster = cluster
        self.backend = backend
        self.registry = registry
        self.timeout = float(timeout)
        self.max_plans = max_plans
        self.memory_budget = check_budget(memory_budget)
        self.executor: Executor | None = None
        self.device_type: str | None = None
        self._plans: OrderedDict[tuple, tuple[tuple[TensorSpec, ...], LoadedProgram]] = \
            OrderedDict()
        self._calls: LruCache[tuple, list[_Move]] = LruCache(4 * max_plans)
        self.hits = self.misses = 0

    @property
    def alive(self) -> bool:
        """True while the default process group it was made for exists."""
        import torch.distributed as dist

        return dist.is_initialized() and dist.group.WORLD is self.world_group

    # ----- set-up on first use -----------------------------------------------------------
    def _cluster(self) -> Cluster:
        if self.cluster is None:
            names = self._hostnames()
            hosts: dict[str, list[int]] = {}
            for rank, name in enumerate(names):
                hosts.setdefault(str(name), []).append(rank)
            self.cluster = Cluster.from_hosts(list(hosts.values()))
        return self.cluster

    def _hostnames(self) -> list[str]:
        """Every rank's host name: the first exchange of a Redistributor, through the
        default group's store within this Redistributor's timeout (the group's own
        collectives would wait for the group's, 30 minutes by default, on a rank that
        failed before its call); past it, an ExecutionError naming the ranks that never
        came. A group of its own (not the default) exchanges by all-gather."""
        import torch.distributed as dist

        world = dist.get_world_size()
        store = None
        if self.group is None or self.group is dist.group.WORLD:
            try:
                from torch.distributed.distributed_c10d import _get_default_store

                store = _get_default_store()
            except (ImportError, RuntimeError, ValueError):  # private: may move
                store = None
        if store is None:
            names: list[Any] = [None] * world
            dist.all_gather_object(names, socket.gethostname(), group=self.group)
            return [str(n) for n in names]
        # the round: every rank adds 1 once per exchange, and a rank's next exchange
        # starts only after every rank added for this one (it waits for all below)
        ticket = int(store.add("reshard/hosts/tickets", 1))
        prefix = f"reshard/hosts/{(ticket - 1) // world}/"
        store.set(f"{prefix}{dist.get_rank()}", socket.gethostname())
        keys = [f"{prefix}{r}" for r in range(world)]
        try:
            store.wait(keys, datetime.timedelta(seconds=self.timeout))
        except RuntimeError as e:  # the store's timeout
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise ExecutionError(
                f"rank {dist.get_rank()}: ranks {missing} did not join the redistribute "
                f"within {self.timeout:g}s (they failed before their call, or call other "
                f"collectives): every rank of the default group calls it, in one order "
                f"({str(e).splitlines()[0][:120]})") from None
        return [store.get(k).decode() for k in keys]

    def _executor(self, device_type: str) -> Executor:
        if self.executor is None:
            buffers = "tensor" if device_type == "cuda" else "numpy"
            self.executor = Executor.create(self.backend, self.group, timeout=self.timeout,
                                            buffers=buffers, registry=self.registry,
                                            memory_budget=self.memory_budget)
            self.device_type = device_type
        elif device_type != self.device_type:
            raise ReshardError(
                f"this Redistributor runs on {self.device_type} tensors, got a mesh of "
                f"device type {device_type!r}; use one Redistributor per device type")
        return self.executor

    # ----- planning ------------------------------------------------------------------
    def _moves(self, dtensors: Sequence[DTensor], meshes: Sequence[Any],
               placements: Sequence[Sequence[Any]], names: Sequence[str],
               casts: Sequence[Cast | None]) -> list[_Move]:
        moves = []
        for dt, mesh, pl, name, cast in zip(dtensors, meshes, placements, names, casts):
            if not isinstance(dt, DTensor):
                raise ReshardError(f"{name}: expected a DTensor, got {type(dt).__name__}; "
                                   f"make one with DTensor.from_local or distribute_tensor")
            if mesh.device_type != dt.device_mesh.device_type:
                raise ReshardError(
                    f"{name}: source mesh is on {dt.device_mesh.device_type!r}, destination "
                    f"on {mesh.device_type!r}; redistribute between meshes of one device type")
            shape = tuple(int(n) for n in dt.shape)
            src = to_layout(dt.device_mesh, dt.placements, shape)
            dst = to_layout(mesh, tuple(pl), shape)
            dtype, bits = _plan_dtype(dt.dtype, src.spec.is_partial, cast, name)
            moves.append(_Move(shape, dtype, bits, src, dst, cast))
        return moves

    def plan(self, moves: Sequence[_Move], strategy: Strategy,
             device_type: str) -> tuple[tuple[TensorSpec, ...], LoadedProgram]:
        """The plan's tensors for ``moves`` and this rank's loaded program (cached). Every
        rank plans for itself and keeps only its program; the ranks compare the plan's
        digest first (:meth:`Executor.load_request`): a rank given other tensors raises
        a PlanError on every rank instead of hanging."""
        key = (strategy, tuple(m.request for m in moves))
        hit = self._plans.get(key)
        if hit is not None:
            self._plans.move_to_end(key)
            self.hits += 1
            return hit
        self.misses += 1
        ex = self._executor(device_type)
        loaded, tensors = ex.load_request([m.request for m in moves], self._cluster(),
                                          strategy=strategy)
        self._plans[key] = (tensors, loaded)
        while len(self._plans) > self.max_plans:
            self._plans.popitem(last=False)
        return tensors, loaded

    # ----- moving ----------------------------------------------------------------------
    def redistribute_many(self, tensors: Mapping[str, DTensor] | Sequence[DTensor],
                          device_mesh: Any, placements: Any, *,
                          strategy: str | Strategy = Strategy.BROADCAST, cast: Any = None,
                          scale: Any = None) -> Any:
        """See :func:`redistribute_many`."""
        names, dts = _items(tensors)
        if not dts:
            return {} if isinstance(tensors, Mapping) else []
        conversions = _conversions(cast, scale, names, dts)
        meshes = _per_tensor(device_mesh, names, "device_mesh", _is_mesh)
        pls = _per_tensor(placements, names, "placements", _is_placements)
        device_type = str(meshes[0].device_type)
        strat = Strategy.parse(strategy)
        # a repeated call (a training loop's) skips the layouts' derivation: keyed by
        # the DTensors' meshes, placements, shapes and dtypes (each hashed once, cheap)
        call = (strat, tuple(conversions), tuple(
            (dt.device_mesh, dt.placements, dt.shape, dt.dtype, mesh, tuple(pl))
            for dt, mesh, pl in zip(dts, meshes, pls)))
        moves = self._calls.get_or_make(
            call, lambda: self._moves(dts, meshes, pls, names, conversions))
        tensors_, loaded = self.plan(moves, strat, device_type)
        ex = self._executor(device_type)
        me = ex.device
        device = dts[0].to_local().device
        sources: list[Any] = [None] * len(tensors_)
        outs: list[Any] = [None] * len(tensors_)
        locals_: dict[int, torch.Tensor] = {}
        for i, (dt, m) in enumerate(zip(dts, moves)):
            if me in m.src.devices:
                local = dt.to_local().detach().contiguous()
                sources[i] = local if m.bits is None else local.view(m.bits)
        views = _local_views(loaded, tensors_, sources, [dt.dtype for dt in dts])
        if views is not None:  # only copies within this rank: views, as DTensor gives
            return self._results(dts, meshes, pls, moves, tensors_, views, names, tensors)
        for k in output_indices(tensors_):
            t = tensors_[k]
            if me not in t.dst.devices:
                continue
            shape = loaded.dst_shape(k)
            bits = moves[k].bits if k < len(moves) else None
            torch_dtype = dts[k].dtype if bits is not None else getattr(torch, t.out_dtype)
            locals_[k] = torch.empty(shape, dtype=torch_dtype, device=device)
            outs[k] = locals_[k] if bits is None else locals_[k].view(bits)
        self._run(ex, loaded, sources, outs)
        return self._results(dts, meshes, pls, moves, tensors_, locals_, names, tensors)

    @staticmethod
    def _run(ex: Executor, loaded: LoadedProgram, sources: list[Any], outs: list[Any]) -> None:
        try:
            ex.run(loaded, sources, outs).wait()
        except ShapeError as e:
            raise ShapeError(f"{e} (a DTensor's local tensor must be its shard under "
                             f"DTensor's placement rule)") from None

    @staticmethod
    def _results(dts: list, meshes: list, pls: list, moves: list[_Move],
                 tensors_: tuple[TensorSpec, ...], locals_: dict[int, torch.Tensor],
                 names: list[str], tensors: Any) -> Any:
        results: list[Any] = []
        for i, (dt, mesh, pl, m) in enumerate(zip(dts, meshes, pls, moves)):
            t = tensors_[i]
            value = _dtensor(locals_.get(i), dt, mesh, tuple(pl), m.shape, t.out_dtype)
            if t.link < 0:
                results.append(value)
                continue
            sc = tensors_[t.link]
            results.append((value, _dtensor(locals_.get(t.link), dt, mesh,
                                            to_placements(sc.dst), sc.shape, "float32")))
        if isinstance(tensors, Mapping):
            return dict(zip(names, results))
        return results

    def redistribute(self, dtensor: DTensor, device_mesh: Any, placements: Sequence[Any], *,
                     strategy: str | Strategy = Strategy.BROADCAST, cast: Any = None,
                     scale: Any = None) -> Any:
        """See :func:`redistribute`."""
        return self.redistribute_many([dtensor], device_mesh, [tuple(placements)],
                                      strategy=strategy, cast=cast, scale=scale)[0]

    def close(self) -> None:
        """Drop the plans and the executor (the caller's process group stays)."""
        self._plans.clear()
        self._calls = LruCache(4 * self.max_plans)
        if self.executor is not None:
            self.executor.close()
            self.executor = None


def _conversions(cast: Any, scale: Any, names: Sequence[str],
                 dtensors: Sequence[DTensor]) -> list[Cast | None]:
    """Each tensor's conversion: ``cast`` and ``scale`` each one value for every tensor,
    a mapping by name (a name it lacks: none), or a callable ``f(name, dtensor)``
    giving the value (a rule: ``lambda n, t: "block128" if t.ndim >= 2 else None``).
    Block scales on a tensor of rank under 2 are refused naming it and the rule."""
    def pick(value: Any, name: str, dt: DTensor) -> Any:
        if isinstance(value, Mapping):
            return value.get(name)
        if callable(value) and not isinstance(value, (str, Cast, ScaleMode, torch.dtype)):
            return value(name, dt)
        return value

    out = []
    for name, dt in zip(names, dtensors):
        got = Cast.parse(pick(cast, name, dt), pick(scale, name, dt))
        if got is not None and dt.ndim < got.scale.min_rank:
            raise DTypeError(
                f"{name}: scale={got.scale.value!r} takes blocks of the last "
                f"{got.scale.min_rank} dim(s), but {name} has rank {dt.ndim} (shape "
                f"{tuple(dt.shape)}); give a rule per "
                f"tensor: cast=lambda n, t: 'float8_e4m3fn' if t.ndim >= 2 else None, "
                f"scale=lambda n, t: 'block128' if t.ndim >= 2 else None (biases and norms "
                f"then move as they are), or a mapping by name")
        out.append(got)
    return out


def _local_views(loaded: LoadedProgram, tensors: tuple[TensorSpec, ...], sources: list[Any],
                 dtypes: list[torch.dtype]) -> dict[int, torch.Tensor] | None:
    """Where every task of this rank's program is a copy within it that converts
    nothing (DTensor's ``Replicate -> Shard``), each destination shard as a view of its
    source's local tensor (contiguous, as DTensor's own result), in the DTensor's dtype
    ``dtypes[k]``; None where one is not (the program runs)."""
    if len(tensors) != len(dtypes) or any(
            t.kind is not TaskKind.COPY for _, t in loaded.program.tasks):
        return None
    views: dict[int, torch.Tensor] = {}
    for k, box in loaded.dst_box.items():
        if tensors[k].cast or sources[k] is None or k not in loaded.src_box:
            return None
        view = sources[k][local_slices(box, loaded.src_box[k])]
        if not view.is_contiguous():
            return None
        views[k] = view.view(dtypes[k])
    return views


def _dtensor(local: torch.Tensor | None, like: DTensor, mesh: Any, placements: tuple,
             shape: tuple[int, ...], dtype: str) -> DTensor:
    """A DTensor of this rank's destination shard (DTensor's empty local tensor on a rank
    outside ``mesh``)."""
    if local is None:
        local = like.to_local().new_empty(0, dtype=getattr(torch, dtype))
    return DTensor.from_local(local, mesh, placements, run_check=False,
                              shape=torch.Size(shape), stride=_contiguous_stride(shape))


def _is_mesh(value: Any) -> bool:
    from torch.distributed.device_mesh import DeviceMesh as TorchMesh

    return isinstance(value, TorchMesh)


def _is_placements(value: Any) -> bool:
    from torch.distributed.tensor import Placement

    return isinstance(value, (list, tuple)) and all(isinstance(p, Placement) for p in value)


def _items(tensors: Mapping[str, DTensor] | Sequence[DTensor]) -> tuple[list[str], list]:
    if isinstance(tensors, Mapping):
        return [str(k) for k in tensors], list(tensors.values())
    if isinstance(tensors, (list, tuple)):
        return [f"tensor {i}" for i in range(len(tensors))], list(tensors)
    raise ReshardError(f"expected a mapping (a state dict) or a sequence of DTensors, got "
                       f"{type(tensors).__name__}")


def _per_tensor(value: Any, names: list[str], what: str, is_one: Any) -> list:
    """``value`` for every tensor: one for all, a mapping by name, or a sequence."""
    if is_one(value):
        return [value] * len(names)
    if isinstance(value, Mapping):
        missing = [n for n in names if n not in value]
        if missing:
            raise ReshardError(f"{what} has no entry for {missing[:5]}; give one per tensor, "
                               f"or one {what} for all")
        vals = [value[n] for n in names]
    elif isinstance(value, (list, tuple)) and len(value) == len(names):
        vals = list(value)
    else:
        raise ReshardError(f"{what} must be one {what} for every tensor, a mapping by name "
                           f"or a sequence of {len(names)}, got {type(value).__name__}")
    bad = [n for n, v in zip(names, vals) if not is_one(v)]
    if bad:
        raise ReshardError(f"{what} of {bad[:5]} is not a valid {what}")
    return vals


def default_redistributor() -> Redistributor:
    """The Redistributor of this context for the current default process group (made on
    first use, replaced once its group is gone)."""
    current = _CURRENT.get()
    if current is None or not current.alive:
        current = Redistributor()
        _CURRENT.set(current)
    return current


def redistribute(dtensor: DTensor, device_mesh: Any, placements: Sequence[Any], *,
                 strategy: str | Strategy = Strategy.BROADCAST, cast: Any = None,
                 scale: Any = None, redistributor: Redistributor | None = None) -> Any:
    """``dtensor`` moved to ``device_mesh`` with ``placements`` (module docstring).

    A collective over the default process group: every rank calls it with the same
    arguments.

    Args:
        dtensor: the source DTensor (on ranks outside its mesh, DTensor's empty local).
        device_mesh: the destination torch DeviceMesh (any ranks of the world).
        placements: one per destination mesh dim: ``Shard(d)``, ``Replicate()``,
            ``Partial("sum")``.
        strategy: ``"broadcast"`` (default), ``"send_recv"`` or ``"allgather"``.
        cast: deliver this dtype (e.g. ``torch.bfloat16``, ``"float8_e4m3fn"``),
            converted at the source before any byte moves (:mod:`reshard.core.dtypes`).
        scale: with a float8 ``cast``: ``"tensor"``, ``"block128"``,
            ``"block128-ue8m0"`` or ``"mx32"`` scales (:class:`reshard.core.dtypes.ScaleMode`).
        redistributor: the context to use (default: :func:`default_redistributor`).

    Returns:
        A DTensor on ``device_mesh`` with ``placements``, the same shape, its dtype or
        ``cast``; with ``scale``, ``(values, scales)``: the scales a float32 DTensor on
        ``device_mesh`` (placed like the values when their shards hold whole 128 x 128
        blocks, else replicated), ``x ~= values * scales`` per block.

    Raises:
        ReshardError: a bad argument (naming it), before anything moves.
        ExecutionError: a transfer failed (naming the task).
    """
    rd = default_redistributor() if redistributor is None else redistributor
    return rd.redistribute(dtensor, device_mesh, placements, strategy=strategy, cast=cast,
                           scale=scale)


def redistribute_many(tensors: Mapping[str, DTensor] | Sequence[DTensor], device_mesh: Any,
                      placements: Any, *, strategy: str | Strategy = Strategy.BROADCAST,
                      cast: Any = None, scale: Any = None,
                      redistributor: Redistributor | None = None) -> Any:
    """Every DTensor of ``tensors`` (a state dict, or a list) moved with one plan.

    A collective over the default process group: every rank calls it with the same
    arguments.

    Args:
        tensors: name -> DTensor (or a sequence).
        device_mesh: the destination mesh, one for all or per tensor (a mapping by name,
            or a sequence).
        placements: the destination placements, one sequence for all or per tensor
            (e.g. column- and row-parallel weights of a tensor-parallel model).
        strategy: as for :func:`redistribute`.
        cast, scale: as for :func:`redistribute`: one value for every tensor, a mapping
            by name (a name it lacks: no conversion), or a rule ``f(name, dtensor)``.
            An RL weight sync from a bf16 trainer to an fp8 inference engine, block
            scales on the matrices and the rest (biases, norms) as they are:
            ``cast=lambda n, t: "float8_e4m3fn" if t.ndim >= 2 else None,
            scale=lambda n, t: "block128" if t.ndim >= 2 else None``.
        redistributor: as for :func:`redistribute`.

    Returns:
        The moved DTensors in the same container: a dict with the same keys, or a list
        (a tensor with scales: a ``(values, scales)`` pair).
    """
    rd = default_redistributor() if redistributor is None else redistributor
    return rd.redistribute_many(tensors, device_mesh, placements, strategy=strategy,
                                cast=cast, scale=scale)

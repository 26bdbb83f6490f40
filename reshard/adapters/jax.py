"""JAX layouts: ``NamedSharding`` <-> a reshard :class:`Layout`, and moving a ``jax.Array``
to another sharding (other devices included) through a reshard plan.

A ``PartitionSpec`` entry names the mesh axes that split a dim, major first, exactly as
a reshard spec token does (``P(("b", "a"), None)`` on axes ``("a", "b")`` is ``"S10R"``);
JAX (XLA) tiles flat and requires every split dim to divide evenly, so layouts made
here use the flat rule and, given a shape, refuse what JAX refuses. ``unreduced`` mesh
axes (partial sums) become the spec's partial axes. Device ids are ``jax.Device.id``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from reshard.core.cluster import Cluster
from reshard.core.dtypes import parse_dtype
from reshard.core.errors import ReshardError, ShapeError, SpecError
from reshard.core.layout import Layout
from reshard.core.mesh import DeviceMesh
from reshard.core.spec import ShardingSpec, SplitRule
from reshard.planner.values.strategy import Strategy

__all__ = ["ProcessMove", "cost_request", "from_layout", "mesh_of", "reshard_array", "to_layout",
           "to_sharding"]


def _id(device: Any) -> int:
    return int(device.id)


def mesh_of(mesh: Mesh | AbstractMesh) -> DeviceMesh:
    """The reshard mesh of a JAX ``Mesh``: device ids row-major, its axis names (a mesh
    of no axes becomes one axis of size 1)."""
    if not isinstance(mesh, Mesh):
        raise SpecError(
            f"expected a concrete jax.sharding.Mesh (one with devices), got "
            f"{type(mesh).__name__} {mesh}; use a NamedSharding built on a Mesh")
    ids = [_id(d) for d in np.asarray(mesh.devices).flat]
    if not mesh.axis_names:
        return DeviceMesh((1,), devices=ids)
    return DeviceMesh(tuple(mesh.devices.shape), devices=ids,
                      axis_names=tuple(str(n) for n in mesh.axis_names))


def _named(sharding: NamedSharding, rank: int | None) -> Layout:
    mesh = mesh_of(sharding.mesh)
    names = [str(n) for n in sharding.mesh.axis_names]
    entries = tuple(sharding.spec.partitions)
    if rank is not None and len(entries) > rank:
        raise SpecError(
            f"{sharding.spec} has {len(entries)} entries, more than the array's rank {rank}")
    rank = len(entries) if rank is None else rank
    dims = [_axes(e, names, sharding.spec) for e in entries]
    dims += [()] * (rank - len(dims))
    if sharding.spec.reduced:
        raise SpecError(
            f"{sharding.spec} has reduced axes {sorted(sharding.spec.reduced)}; reshard "
            f"moves plain or unreduced (partial-sum) arrays: drop reduced= first")
    partial = tuple(_axes(tuple(sorted(sharding.spec.unreduced)), names, sharding.spec))
    return Layout(mesh, ShardingSpec(tuple(dims), partial, SplitRule.FLAT))


def _single(sharding: SingleDeviceSharding, rank: int | None) -> Layout:
    (device,) = sharding.device_set
    return Layout(DeviceMesh((1,), devices=[_id(device)]),
                  ShardingSpec.replicated(rank or 0))


_READERS: dict[type, Callable[[Any, int | None], Layout]] = {
    NamedSharding: _named,
    SingleDeviceSharding: _single,
}


def _axes(entry: object, names: list[str], spec: PartitionSpec) -> tuple[int, ...]:
    if entry is None:
        return ()
    if entry is PartitionSpec.UNCONSTRAINED:
        raise SpecError(
            f"{spec} leaves a dim UNCONSTRAINED, which has no fixed layout; name its mesh "
            f"axes or None")
    axes = (entry,) if isinstance(entry, str) else tuple(entry)  # type: ignore[arg-type]
    unknown = [a for a in axes if a not in names]
    if unknown:
        raise SpecError(f"{spec} names mesh axes {unknown}, not in the mesh's axes {names}")
    return tuple(names.index(str(a)) for a in axes)


def to_layout(sharding: NamedSharding | SingleDeviceSharding,
              shape: Sequence[int] | int | None = None) -> Layout:
    """The layout of ``sharding``: ``layout.index_map(shape)`` equals
    ``sharding.devices_indices_map(shape)`` (by device id).

    Args:
        sharding: a ``NamedSharding`` (or a ``SingleDeviceSharding``).
        shape: the global shape, or just its rank (default: the PartitionSpec's length).
            With a full shape, a split dim that its mesh axes do not divide raises, as
            JAX does.

    Raises:
        SpecError: an unsupported sharding type or PartitionSpec entry.
        ShapeError: a split dim not divisible by its axes (JAX's rule).
    """
    reader = _READERS.get(type(sharding))
    if reader is None:
        raise SpecError(
            f"unsupported sharding {type(sharding).__name__}; valid: "
            f"{[t.__name__ for t in _READERS]} (GSPMD / positional shardings: make a "
            f"NamedSharding)")
    rank = shape if isinstance(shape, int) or shape is None else len(shape)
    layout = reader(sharding, rank)
    if shape is not None and not isinstance(shape, int):
        _check_divisible(layout, tuple(shape), sharding)
    return layout


def _check_divisible(layout: Layout, shape: tuple[int, ...], sharding: object) -> None:
    for d, n in enumerate(shape):
        k = layout.num_chunks(d)
        if n % k:
            raise ShapeError(
                f"{sharding} splits array dim {d} {k} ways, so its size should be "
                f"divisible by {k}, but it is equal to {n} (full shape: {shape}); JAX "
                f"allows only even tiles: pad the dim or split it fewer ways")


def to_sharding(layout: Layout, mesh: Mesh | None = None) -> NamedSharding:
    """The ``NamedSharding`` of ``layout``.

    Args:
        layout: a layout (either split rule: JAX's even tiles are the same under both).
        mesh: a JAX ``Mesh`` with ``layout``'s devices in its order and shape; default one
            made from ``jax.devices()`` by id with the layout's axis names.

    Raises:
        SpecError: ``mesh`` does not match the layout's devices and shape, or (without
            ``mesh``) the layout uses a device id JAX does not have.
    """
    if mesh is None:
        by_id = {_id(d): d for d in jax.devices()}
        missing = [i for i in layout.devices if i not in by_id]
        if missing:
            raise SpecError(
                f"layout {layout} uses device ids {missing} that JAX does not have "
                f"(jax.devices() ids: {sorted(by_id)}); pass mesh= or use existing ids")
        devs = np.array([by_id[i] for i in layout.devices], dtype=object)
        mesh = Mesh(devs.reshape(layout.mesh.shape), layout.mesh.axis_names)
    ours = mesh_of(mesh)
    if (ours.shape, ours.devices) != (layout.mesh.shape, layout.mesh.devices):
        raise SpecError(
            f"JAX mesh {ours.shape} with devices {list(ours.devices)} does not match "
            f"layout {layout} ({layout.mesh.shape}, devices {list(layout.devices)}); pass "
            f"a Mesh of the same devices in the same row-major order")
    names = [str(n) for n in mesh.axis_names]
    entries = [None if not axes else names[axes[0]] if len(axes) == 1
               else tuple(names[a] for a in axes) for axes in layout.spec.dims]
    unreduced = {names[a] for a in layout.spec.partial}
    spec = PartitionSpec(*entries, unreduced=unreduced) if unreduced else PartitionSpec(*entries)
    return NamedSharding(mesh, spec)


from_layout = to_sharding
"""The adapters' one shape: ``to_layout`` (the system's sharding to a reshard
:class:`~reshard.core.layout.Layout`) and ``from_layout`` (back); here :func:`to_sharding`."""


def reshard_array(x: jax.Array, sharding: NamedSharding, *,
                  strategy: str | Strategy | None = None,
                  runtime: Any = None, cast: Any = None,
                  scale: str | None = None) -> Any:
    """``x`` moved to ``sharding`` (other devices allowed); equal to
    ``jax.device_put(x, sharding)`` bit for bit, in any dtype (JAX's ``bfloat16`` and
    float8 types included).

    Where JAX can make the move itself, it does: with every device of both shardings in
    this process, no partial (``unreduced``) axis, and none of reshard's own options
    (``strategy``, ``runtime``, ``cast``, ``scale``), this is ``jax.device_put`` (on
    device, no host round trip). Otherwise the move runs as a reshard plan: the source
    shards leave through ``x.addressable_shards``, the plan runs on ``runtime``
    (default: a fresh in-process ``Runtime(backend="local")``, the reference executor),
    and the result is assembled with ``jax.make_array_from_single_device_arrays``.

    Args:
        x: a fully addressable array (every shard in this process).
        sharding: the destination ``NamedSharding``.
        strategy: the plan's strategy (``"broadcast"``, ``"send_recv"``, ``"allgather"``;
            given, the move runs as a reshard plan; None: JAX's where it can, else
            ``"broadcast"``).
        runtime: a :class:`reshard.Runtime` whose devices are the JAX device ids.
        cast: deliver this dtype instead, converted at the source (e.g.
            ``jnp.bfloat16``, ``"float8_e4m3fn"``; see :mod:`reshard.core.dtypes`).
        scale: with a float8 ``cast``: ``"tensor"``, ``"block128"``,
            ``"block128-ue8m0"`` or ``"mx32"`` scales (:class:`reshard.core.dtypes.ScaleMode`).

    Returns:
        The moved array; with ``scale``, ``(values, scales)``: the scales a float32
        array on the destination mesh (``x ~= values * scales`` per block).
    """
    if _jax_moves_it(x, sharding, strategy, runtime, cast, scale):
        return jax.device_put(x, sharding)
    if strategy is None:
        strategy = Strategy.BROADCAST
    shards = _source_shards(x)
    src = to_layout(x.sharding, x.shape)  # type: ignore[arg-type]  # checked inside
    dst = to_layout(sharding, x.shape)
    options = {"cast": cast, "scale": scale}
    if runtime is None:
        from reshard.runtime import Runtime

        with Runtime(backend="local") as rt:
            out, scales = _run(rt, shards, src, dst, x, strategy, options)
    else:
        out, scales = _run(runtime, shards, src, dst, x, strategy, options)
    values = _assemble(out, x.shape, sharding, dst)
    if scales is None:
        return values
    shape, layout, shards_of = scales
    mesh = sharding.mesh
    assert isinstance(mesh, Mesh)  # to_layout refused an AbstractMesh above
    return values, _assemble(shards_of, shape, to_sharding(layout, mesh), layout)


def _source_shards(x: jax.Array) -> dict[int, np.ndarray]:
    """Each device's shard of ``x`` on the host (a replica's once)."""
    if not x.is_fully_addressable:
        raise ReshardError(
            "reshard_array needs every shard of x in this process (x.is_fully_addressable "
            "is False); in each JAX process, plan and run its part with reshard's Executor "
            "(Executor.load_request: every process plans the same request, the digests "
            "are compared before any byte moves)")
    shards: dict[int, np.ndarray] = {}
    for shard in x.addressable_shards:
        shards.setdefault(_id(shard.device), np.asarray(shard.data))
    return shards


def _jax_moves_it(x: jax.Array, sharding: Any, *options: Any) -> bool:
    """True where ``jax.device_put`` makes the move (:func:`reshard_array`): every device
    here, no partial axis, and no reshard option given."""
    if any(o is not None for o in options):
        return False
    if not (x.is_fully_addressable and getattr(sharding, "is_fully_addressable", False)):
        return False
    for s in (x.sharding, sharding):
        if getattr(getattr(s, "spec", None), "unreduced", None):
            return False
    return True


def _assemble(shards: dict[int, np.ndarray], shape: tuple[int, ...], sharding: NamedSharding,
              layout: Layout, dtype: Any = None) -> jax.Array:
    """A jax.Array of this process's shards (device ids as JAX's); ``dtype``: the
    array's, for a process holding none of it."""
    by_id: dict[int, Any] = {_id(d): d for d in sharding.device_set}
    arrays = [jax.device_put(shards[i], by_id[i]) for i in layout.devices
              if by_id[i].process_index == jax.process_index()]
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays,
                                                    dtype=None if arrays else dtype)


def _run(rt: Any, shards: dict[int, np.ndarray], src: Layout, dst: Layout, x: jax.Array,
         strategy: str | Strategy, options: dict[str, Any]) -> tuple[dict[int, np.ndarray], Any]:
    """The destination shards, and (shape, layout, shards) of the scales (or None)."""
    a = rt.put_shards(shards, src, x.shape, parse_dtype(x.dtype))
    try:
        b = rt.reshard(a, dst, strategy, **options)
        try:
            scales = None if b.scales is None else (b.scales.shape, b.scales.layout,
                                                     rt.shards(b.scales))
            return rt.shards(b), scales
        finally:
            rt.free(b)
    finally:
        rt.free(a)


def cost_request(shape: Sequence[int], dtype: Any, src: NamedSharding | SingleDeviceSharding,
                 dst: NamedSharding | SingleDeviceSharding, cluster: Cluster | None = None
                 ) -> tuple[Any, ...]:
    """A :func:`reshard.estimate_many` request for moving an array of ``shape`` /
    ``dtype`` from sharding ``src`` to ``dst`` (JAX device ids are the cluster's
    device ids): ``reshard.estimate_many([cost_request(...), ...], cache=...)`` prices
    a ``device_put`` between them as reshard would run it."""
    shape = tuple(int(n) for n in shape)
    return (shape, parse_dtype(dtype).name, to_layout(src, shape), to_layout(dst, shape),
            cluster)


class ProcessMove:
    """A move between shardings whose devices live in several JAX processes
    (multi-controller JAX: each process sees its own devices only), run by reshard's
    embeddable Executor, one rank per process.

    ``jax.device_put`` between two device sets of several processes is refused on CPU
    and GPU ("input and target sharding should have the same set of devices"; JAX has
    experimental support on TPU alone), and a jit whose input and output shardings name
    different devices is too. Every process builds the same move (same arguments, in the
    same order), which plans it once (:meth:`Executor.load_request`: each process plans
    the whole request and the plans' digests are compared before any byte moves) and
    loads only this process's program; then each call moves one array::

        ex = Executor.create("gloo", my_id, all_ids, rendezvous, 60.0)
        move = ProcessMove(ex, x.shape, x.dtype, x.sharding, target)
        y = move(x)        # in every process; y.sharding == target

    Args:
        executor: a :class:`reshard.comm.executor.Executor` whose device is this
            process's JAX device (``jax.Device.id``; at most one of the two shardings'
            devices per process) and whose world holds every device of both. A process
            of its world with no device of either builds the move too where the backend
            loads every program on every rank (gloo); its calls return an array with no
            shard here.
        shape, dtype: the array's.
        src, dst: its sharding and the target one.
        strategy: the plan's strategy (default broadcast).
        cluster: the cluster to plan for (default: one host per JAX process, the
            ``"paper"`` preset's figures).
    """

    def __init__(self, executor: Any, shape: Sequence[int], dtype: Any,
                 src: NamedSharding, dst: NamedSharding, *,
                 strategy: str | Strategy = Strategy.BROADCAST,
                 cluster: Cluster | None = None) -> None:
        self.shape = tuple(int(n) for n in shape)
        self.sharding = dst
        self.src, self.dst = to_layout(src, self.shape), to_layout(dst, self.shape)
        mine = {_id(d) for d in (*src.addressable_devices, *dst.addressable_devices)}
        if not mine <= {executor.device}:
            raise ReshardError(
                f"ProcessMove runs one reshard rank per JAX process: this process holds "
                f"devices {sorted(mine)} of the two shardings, its executor is device "
                f"{executor.device}; give each process at most one device of the "
                f"shardings and an Executor for it")
        if cluster is None:
            hosts: dict[int, list[int]] = {}
            for d in sorted({*src.device_set, *dst.device_set}, key=_id):
                hosts.setdefault(d.process_index, []).append(_id(d))
            cluster = Cluster.from_hosts(hosts[p] for p in sorted(hosts))
        self.executor, self.dtype = executor, dtype
        self.loaded, _ = executor.load_request(
            [(self.shape, parse_dtype(dtype).name, self.src, self.dst)], cluster,
            strategy=strategy)

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x`` (this move's shape and source sharding) at the target sharding."""
        me = self.executor.device
        shard = None
        if me in self.src.devices:
            shard = np.asarray(x.addressable_shards[0].data)
        out = self.executor.run(self.loaded, [shard]).wait()
        got = {me: out[0]} if me in self.dst.devices else {}
        return _assemble(got, self.shape, self.sharding, self.dst, self.dtype)

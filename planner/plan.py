"""Planning entry points: :func:`plan` and :func:`plan_many`.

Pure and deterministic: the same inputs give the same plan, nothing touches a
process, a device or a global.
"""

from __future__ import annotations

from typing import Iterable, Sequence, Union

import numpy as np

from reshard.cluster import Cluster
from reshard.errors import DTypeError, PartialError, ReshardError, SpecError
from reshard.layout import Box, Layout, box_size, check_shape
from reshard.planner.balance import Loads
from reshard.planner.decompose import Cell, decompose, devices_by_box
from reshard.planner.ir import ReshardPlan, Task, TaskKind, TensorSpec
from reshard.planner.order import order_tasks
from reshard.planner.strategies import CELL_PLANNERS
from reshard.planner.strategy import Strategy

NUMERIC_KINDS = "biufc"
SUMMABLE_KINDS = "iufc"

Request = Union[TensorSpec, Sequence]


def parse_dtype(dtype: object) -> np.dtype:
    """Parse a dtype at the API edge; only plain numeric dtypes are supported."""
    if dtype is None:
        raise DTypeError("dtype is None; pass a numeric dtype such as np.float32 or 'int32'")
    try:
        dt = np.dtype(dtype)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise DTypeError(
            f"unknown dtype {dtype!r}; use a numpy numeric dtype such as 'float32', "
            f"'int32', 'bfloat16' is not a numpy dtype (use 'uint16' bits instead)"
        ) from None
    if dt.kind not in NUMERIC_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise DTypeError(
            f"dtype {dt} (kind {dt.kind!r}) is not supported; use a plain numeric dtype: "
            f"bool, int*, uint*, float*, complex*"
        )
    return dt


def make_tensor_spec(shape: Sequence[int], dtype: object, src: Layout, dst: Layout,
                     cluster: Cluster) -> TensorSpec:
    """Validate one request and freeze it as a :class:`TensorSpec`."""
    shape_t = check_shape(shape)
    dt = parse_dtype(dtype)
    for name, lay in (("source", src), ("destination", dst)):
        if not isinstance(lay, Layout):
            raise SpecError(f"{name} layout must be a reshard.Layout, got {type(lay).__name__}")
        try:
            lay.spec.check(lay.mesh.ndim, len(shape_t))
        except SpecError as e:
            raise SpecError(f"{name} layout: {e}") from None
        cluster.check_devices(lay.devices, f"the {name} mesh {lay.mesh}")
        if lay.spec.is_partial and dt.kind not in SUMMABLE_KINDS:
            raise PartialError(
                f"{name} layout '{lay.spec}' is a partial sum, but dtype {dt} has no sum "
                f"(bool adds as logical or); use a numeric dtype or a non-partial layout "
                f"such as '{str(lay.spec).split('+')[0]}'"
            )
    return TensorSpec(shape_t, dt.name, src, dst)


def default_cluster(layouts: Iterable[Layout]) -> Cluster:
    """One host holding every device of the layouts (paper link figures)."""
    devs: set[int] = set()
    for lay in layouts:
        devs.update(lay.devices)
    return Cluster((tuple(sorted(devs)),), name="single-host")


def _reduce_sources(t: TensorSpec, index: int, loads: Loads,
                    needers: dict[Box, frozenset[int]]) -> tuple[dict[Box, frozenset[int]],
                                                                list[Task]]:
    """Holders of each source box, after reducing partial sums to one root per box."""
    if not t.src.spec.is_partial:
        return devices_by_box(t.src, t.shape), []
    boxes = t.src.boxes(t.shape)
    itemsize = np.dtype(t.dtype).itemsize
    by_box: dict[Box, list[tuple[int, ...]]] = {}
    for group in t.src.partial_groups():
        by_box.setdefault(boxes[group[0]], []).append(group)
    out: dict[Box, frozenset[int]] = {}
    tasks = []
    for box, groups in by_box.items():
        # Hosts that need part of this box, to reduce where the data is wanted.
        want_hosts: dict[int, int] = {}
        for dbox, devs in needers.items():
            if all(max(a, c) < min(b, e) for (a, b), (c, e) in zip(box, dbox)) or not box:
                for d in devs:
                    h = loads.host(d)
                    want_hosts[h] = want_hosts.get(h, 0) + 1
        group = min(groups, key=lambda g: (-sum(want_hosts.get(loads.host(d), 0) for d in g),
                                           g))
        root = min(group, key=lambda d: (-want_hosts.get(loads.host(d), 0), d))
        others = tuple(d for d in group if d != root)
        if others and box_size(box):
            nbytes = box_size(box) * itemsize
            tasks.append(Task(TaskKind.REDUCE, index, box, root, others, nbytes))
            for d in others:
                loads.charge(d, (root,), nbytes)
        out[box] = frozenset((root,))
    return out, tasks


def _needers(t: TensorSpec) -> dict[Box, frozenset[int]]:
    """Devices that must receive each destination box (partial: only the leaders; the
    other addends stay zero)."""
    return devices_by_box(t.dst, t.shape, t.dst.partial_leaders())


def plan_many(
    requests: Iterable[Request],
    cluster: Cluster | None = None,
    strategy: Union[str, Strategy] = Strategy.BROADCAST,
) -> ReshardPlan:
    """Plan several tensors together: one sender balance and one global order.

    Args:
        requests: ``(shape, dtype, src_layout, dst_layout)`` tuples or TensorSpecs.
        cluster: hosts and links; default: one host holding every device.
        strategy: ``"broadcast"`` (default), ``"allgather"`` or ``"send_recv"``.

    Returns:
        A frozen :class:`ReshardPlan`.
    """
    strat = Strategy.parse(strategy)
    reqs = []
    for r in requests:
        if isinstance(r, TensorSpec):
            reqs.append((r.shape, r.dtype, r.src, r.dst))
        else:
            try:
                shape, dtype, src, dst = r
            except (TypeError, ValueError):
                raise ReshardError(
                    f"each request is (shape, dtype, src_layout, dst_layout), got {r!r}"
                ) from None
            reqs.append((shape, dtype, src, dst))
    if cluster is None:
        cluster = default_cluster(lay for _, _, s, d in reqs for lay in (s, d))
    elif not isinstance(cluster, Cluster):
        raise ReshardError(f"cluster must be a reshard.Cluster, got {type(cluster).__name__}")
    tensors = tuple(make_tensor_spec(*r, cluster=cluster) for r in reqs)

    loads = Loads(cluster)
    tasks: list[Task] = []
    work: list[tuple[int, int, Cell]] = []  # (tensor, itemsize, cell)
    for i, t in enumerate(tensors):
        needers = _needers(t)
        holders, reduces = _reduce_sources(t, i, loads, needers)
        tasks.extend(reduces)
        itemsize = np.dtype(t.dtype).itemsize
        work.extend((i, itemsize, c) for c in decompose(t.shape, holders, needers))
    # Largest slices first, so balancing places the big ones on free NICs.
    work.sort(key=lambda w: -box_size(w[2].box) * w[1])
    planner = CELL_PLANNERS[strat]
    for i, itemsize, cell in work:
        tasks.extend(planner(cell, i, itemsize, loads))
    return ReshardPlan(tensors, order_tasks(tasks, cluster), strat, cluster)


def plan(
    shape: Sequence[int],
    dtype: object,
    src: Layout,
    dst: Layout,
    cluster: Cluster | None = None,
    strategy: Union[str, Strategy] = Strategy.BROADCAST,
) -> ReshardPlan:
    """Plan moving one tensor of ``shape``/``dtype`` from layout ``src`` to ``dst``.

    Args:
        shape: global tensor shape.
        dtype: numpy dtype or its name.
        src: source layout.
        dst: destination layout (may be on another mesh, disjoint or overlapping).
        cluster: hosts and links used for balancing and costing; default one host.
        strategy: ``"broadcast"`` (default), ``"allgather"`` or ``"send_recv"``.
    """
    return plan_many([(shape, dtype, src, dst)], cluster=cluster, strategy=strategy)

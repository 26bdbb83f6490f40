"""A large plan's prediction from its columns: its sends never built as tasks.

A plan of more tasks than any search pass looks at is kept as first planned
(:data:`~reshard.planner.passes.stages.ALTERNATIVES_UP_TO`), and most of its tasks are
point-to-point sends the planner keeps as columns until a plan asks for them
(:class:`~reshard.planner.schedule.send_columns.OrderedTasks`: every cell of an
all-to-all, 1,048,576 at 1,024 devices a mesh). Its model time needs no task object:
a send's route is one hop (its device's link out and the receiver's link in, and both
NICs where it changes host; :func:`~reshard.planner.costing.cost.task_path`), its
latency the hop's, its devices its two ends. :func:`estimate_columns` lays those out as
the arrays the simulation reads (:meth:`~reshard.planner.costing.fairshare.FairShare.
of_edges`, :meth:`~reshard.planner.costing.stepgate.StepGate.of_members`), the other
tasks' from their routes, task by task in the plan's order: the same arrays, so the same
seconds, bit for bit, as simulating the plan of every task.

Where a send's route or wait reads more than its ends (a cluster with a shared
bandwidth, whose messages may ride in another's; casts converted on the wire), it says
so (None) and the caller builds the plan.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.costing.casts import converts
from reshard.planner.costing.chain_columns import ChainRoutes, chain_routes, kept_routes
from reshard.planner.costing.cost import Routes, shared_hops, task_routes
from reshard.planner.costing.fairshare import FairShare, path_arrays, ranges
from reshard.planner.costing.fluid import simulated_time
from reshard.planner.costing.index_sets import is_arange
from reshard.planner.costing.stepgate import OneStep, StepGate, distinct_devices, has_device
from reshard.planner.schedule.broadcast_columns import BroadcastColumns
from reshard.planner.schedule.send_columns import OrderedTasks, SendColumns
from reshard.planner.values.resources import DEV_IN, DEV_OUT, KIND_CODE, NIC_IN, NIC_OUT
from reshard.planner.values.tasks import Task, TensorSpec


def estimate_columns(ordered: OrderedTasks, tensors: Sequence[TensorSpec], cluster: Cluster,
                     known: Routes | None = None) -> float | None:
    """The model's seconds for the plan of ``ordered``'s tasks (module docstring), or
    None where a send's route reads more than its ends. ``known``: routes found on
    ``cluster`` already (:func:`~reshard.planner.costing.cost.task_routes`)."""
    if cluster.shared_bandwidth or (cluster.cast_bandwidth and any(map(converts, tensors))):
        return None
    cols = ordered.send_columns
    n = len(ordered)
    sent = cols.position
    host, nic = _hosts_and_nics(cluster)
    hops = shared_hops(Routes() if known is None else known, cluster).arrays(cluster)
    kept = _kept(ordered, cluster, *hops)
    objects, positions = (ordered.objects, ordered.positions) if kept is None else \
        (ordered.own_objects, ordered.own_positions)
    chains = chain_routes(objects, cluster, *hops,
                          also=None if kept is None else {kept.members.shape[0] // len(
                              kept.need) - 1: len(kept.need)})
    obj_lens, obj_codes, obj_frac, obj_lat = _routes(objects, chains, cluster, known, tensors)
    obj_frac = _unless_ones(obj_frac)
    at = np.array(positions, dtype=np.int64)
    obj_nbytes = np.array([float(t.nbytes) for t in objects], dtype=np.float64)
    if kept is not None:  # the kept broadcasts' routes after the others', at their places
        at = np.concatenate([at, ordered.kept_positions])
        obj_lens = np.concatenate([obj_lens, kept.lens])
        obj_codes = np.concatenate([obj_codes, kept.codes])
        obj_frac = None if obj_frac is None else \
            np.concatenate([obj_frac, np.ones(len(kept.codes))])
        obj_lat = np.concatenate([obj_lat, kept.lat])
        obj_nbytes = np.concatenate([obj_nbytes, _kept_columns(ordered).nbytes])
    gate = _gate(ordered, objects, n, at, chains, kept)
    if _in_order(at, n):  # no send, every task in its place already: the arrays as they are
        return simulated_time(FairShare.of_edges(obj_codes, obj_frac, obj_lens, cluster),
                              obj_nbytes, gate, obj_lat)
    cross = host[cols.root] != host[cols.recv]
    # laid out by a helper: the codes are freed once the set-up has numbered them
    flows = FairShare.of_edges(*_laid_out(cols, n, at, cross, (host, nic),
                                          (obj_lens, obj_codes, obj_frac)), cluster)
    lat = np.empty(n)
    lat[at] = obj_lat
    lat[sent] = np.where(cross, cluster.latency, cluster.intra_latency)
    nbytes = np.empty(n)
    nbytes[at] = obj_nbytes
    nbytes[sent] = cols.nbytes
    return simulated_time(flows, nbytes, gate, lat)


def _laid_out(cols: SendColumns, n: int, at: np.ndarray, cross: np.ndarray,
              devices: tuple[np.ndarray, np.ndarray],
              objs: tuple[np.ndarray, np.ndarray, np.ndarray | None]
              ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Every task's edges (codes, fractions, each task's count), in the plan's order: a
    send's hop (``cross``: between hosts; ``devices``: each device's host and NIC),
    and the other tasks' routes ``objs`` (lens, codes, fractions) at their places
    ``at``. Fractions None: every one 1.0."""
    (host, nic), (obj_lens, obj_codes, obj_frac) = devices, objs
    a, b, sent = cols.root, cols.recv, cols.position
    lens = np.empty(n, dtype=np.int64)
    lens[at] = obj_lens
    lens[sent] = np.where(cross, 4, 2)
    starts = np.cumsum(lens) - lens
    codes: np.ndarray = np.empty(int(lens.sum()), dtype=_code_type(obj_codes, len(host), nic))
    frac = None if obj_frac is None else np.ones(len(codes))  # None: every one 1.0
    first = starts[sent]
    codes[first] = a * 8 + KIND_CODE[DEV_OUT]
    codes[first + 1] = b * 8 + KIND_CODE[DEV_IN]
    codes[first[cross] + 2] = nic[a[cross]] * 8 + KIND_CODE[NIC_OUT]
    codes[first[cross] + 3] = nic[b[cross]] * 8 + KIND_CODE[NIC_IN]
    if len(at):  # every other task's route in its place, all at once (the same values)
        where = ranges(starts[at], starts[at] + lens[at])
        codes[where] = obj_codes
        if frac is not None:
            frac[where] = obj_frac
    return codes, frac, lens


def _hosts_and_nics(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """Each device's host and NIC, by device (0 for a number no device has)."""
    size = max(cluster.devices, default=-1) + 1
    host, nic = np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64)
    for d, h in cluster.host_map.items():
        host[d], nic[d] = h, cluster.nic_map[d]
    return host, nic


def _code_type(obj_codes: np.ndarray, size: int, nic: np.ndarray) -> type:
    """int32 where every code laid out fits it (a send's: a device or NIC number times 8
    plus a kind; ``obj_codes``: the others'), else int64: the same values, half the
    bytes (a million sends at 1,024 devices lay out four million codes)."""
    top = max(size, int(nic.max(initial=0)) + 1) * 8
    return np.int32 if max(top, int(obj_codes.max(initial=0))) < 1 << 31 else np.int64


def _fractions(frac: np.ndarray | None, n: int) -> np.ndarray:
    """``frac``, or ``n`` fractions of 1.0 where it is None (every fraction 1.0, not yet
    laid out: one array of ones, not the pieces' ones joined)."""
    return np.ones(n) if frac is None else frac


def _in_order(at: np.ndarray, n: int) -> bool:
    """Whether ``at`` is every place of ``n``, in order (then laying out in place is
    copying)."""
    return is_arange(at, n)


def _kept_columns(ordered: OrderedTasks) -> BroadcastColumns:
    """``ordered``'s kept broadcasts (:attr:`OrderedTasks.kept`), where it has them."""
    assert ordered.kept is not None
    return ordered.kept


def _kept(ordered: OrderedTasks, cluster: Cluster, host: np.ndarray, nic: np.ndarray
          ) -> ChainRoutes | None:
    """The routes of ``ordered``'s broadcasts kept as columns, where :func:`~reshard.
    planner.costing.chain_columns.kept_routes` lays out every one (else None: they are
    built and priced as tasks)."""
    kept = ordered.kept
    if kept is None or not len(kept):
        return None
    rows = kept.devices()
    if rows is None:
        return None
    return kept_routes(rows, kept.nbytes, cluster, host, nic, kept.task)


def _routes(objects: Sequence[Task], chains: ChainRoutes | None, cluster: Cluster,
            known: Routes | None, tensors: Sequence[TensorSpec]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """Per task of ``objects``, its route's length and latency, and all their codes
    and fractions, task by task: ``chains``' laid out as arrays (:func:`~reshard.
    planner.costing.chain_columns.chain_routes`), the others' from :func:`~reshard.
    planner.costing.cost.task_routes` (the same values). The fractions are None where
    every task is a chain (each fraction 1.0, :func:`_fractions`)."""
    if chains is not None and len(chains.index) == len(objects):  # every task a chain
        return chains.lens, chains.codes, None, chains.lat
    rest = list(objects) if chains is None else \
        [objects[i] for i in np.flatnonzero(_others(len(objects), chains.index)).tolist()]
    routes = task_routes(rest, cluster, known, tensors)
    paths = [path_arrays(p) for p, _ in routes]
    lens = np.fromiter((len(c) for c, _ in paths), dtype=np.int64, count=len(paths))
    lat = np.array([lt for _, lt in routes], dtype=np.float64)
    codes = np.concatenate([c for c, _ in paths]) if paths else np.zeros(0, dtype=np.int64)
    frac = np.concatenate([f for _, f in paths]) if paths else np.zeros(0)
    if chains is None:
        return lens, codes, frac, lat
    other = _others(len(objects), chains.index)
    all_lens = np.empty(len(objects), dtype=np.int64)
    all_lens[other], all_lens[chains.index] = lens, chains.lens
    starts = np.cumsum(all_lens) - all_lens
    all_codes = np.empty(int(all_lens.sum()), dtype=np.int64)
    all_frac = np.ones(len(all_codes))
    all_codes[ranges(starts[chains.index], starts[chains.index] + chains.lens)] = chains.codes
    if len(lens):
        where = ranges(starts[other], starts[other] + lens)
        all_codes[where], all_frac[where] = codes, frac
    all_lat = np.empty(len(objects))
    all_lat[other], all_lat[chains.index] = lat, chains.lat
    return all_lens, all_codes, all_frac, all_lat


def _unless_ones(frac: np.ndarray | None) -> np.ndarray | None:
    """``frac``, or None where every fraction is 1.0 (then no fraction of the plan's
    sends and the other tasks is laid out: the set-up reads ones, as it finds them)."""
    return None if frac is None or bool((frac == 1.0).all()) else frac


def _devices(objects: Sequence[Task], chains: ChainRoutes | None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Per task of ``objects`` its count of distinct devices, and those devices task by
    task (each task's in any order): ``chains``' their rows, the others' by
    :func:`~reshard.planner.costing.stepgate.distinct_devices`."""
    if chains is None:
        return distinct_devices([t.devices for t in objects])
    if len(chains.index) == len(objects):  # every task a chain: its rows as they are
        return chains.need, chains.members
    other = _others(len(objects), chains.index)
    own, devs = distinct_devices([objects[i].devices for i in np.flatnonzero(other).tolist()])
    need = np.empty(len(objects), dtype=np.int64)
    need[other], need[chains.index] = own, chains.need
    starts = np.cumsum(need) - need
    member = np.empty(int(need.sum()), dtype=np.int64)
    member[ranges(starts[chains.index], starts[chains.index] + chains.need)] = chains.members
    if len(own):
        member[ranges(starts[other], starts[other] + own)] = devs
    return need, member


def _others(n: int, index: np.ndarray) -> np.ndarray:
    """A mask of ``n`` places, true but at ``index``."""
    rest = np.ones(n, dtype=bool)
    rest[index] = False
    return rest


def _one_step(steps: np.ndarray, send_steps: np.ndarray, objects: Sequence[Task],
              kept: ChainRoutes | None) -> bool:
    """Whether every task (``objects`` and the kept broadcasts of ``steps``, the sends
    of ``send_steps``) is in one step and has a device (:func:`~reshard.planner.
    costing.stepgate.has_device`; a send has its two ends, a kept chain its root):
    where :func:`~reshard.planner.costing.stepgate.gate_of` gives the one-step rule."""
    every = np.concatenate([steps, send_steps])
    return bool(len(every)) and bool((every == every[0]).all()) and \
        (kept is None or bool((kept.need > 0).all())) and all(map(has_device, objects))


def _gate(ordered: OrderedTasks, objects: Sequence[Task], n: int, at: np.ndarray,
          chains: ChainRoutes | None, kept: ChainRoutes | None) -> StepGate | OneStep:
    """The step rule of ``ordered``'s tasks: a send's devices are its two ends, a
    chain's of ``chains`` (of ``objects``) or ``kept`` (the kept broadcasts, after
    ``objects`` in ``at``) its root and receivers, another task's its distinct devices
    (:func:`~reshard.planner.costing.stepgate.distinct_devices`; the rule reads each
    task's as a set). Every task in one step, each with a device: the one-step rule
    (:func:`~reshard.planner.costing.stepgate.gate_of`'s, without the memberships)."""
    cols = ordered.send_columns
    steps = np.array([t.step for t in objects], dtype=np.int64)
    if kept is not None:
        steps = np.concatenate([steps, _kept_columns(ordered).step])
    if _one_step(steps, cols.step, objects, kept):
        return OneStep(n)
    own, devs = _devices(objects, chains)
    if kept is not None:
        own = np.concatenate([own, kept.need])
        devs = np.concatenate([devs, kept.members])
    if _in_order(at, n):  # no send, every task in its place already
        return StepGate.of_members(own, devs, steps)
    need = np.empty(n, dtype=np.int64)
    need[at] = own
    need[cols.position] = 2
    starts = np.cumsum(need) - need
    member = np.empty(int(need.sum()), dtype=np.int64)
    first = starts[cols.position]
    member[first] = cols.root
    member[first + 1] = cols.recv
    if len(at):
        member[ranges(starts[at], starts[at] + need[at])] = devs
    step = np.empty(n, dtype=np.int64)
    step[at] = steps
    step[cols.position] = cols.step
    return StepGate.of_members(need, member, step)


__all__ = ["estimate_columns"]

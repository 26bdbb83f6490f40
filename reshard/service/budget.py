"""Sizing a request before any work: how many cells (about as many tasks) its plan
implies, from its layouts alone.

A tensor's source and destination boxes cut each dim at most at the chunk edges of
both layouts, so the cells of its decomposition number at most the product, over its
dims, of those cuts (and of its size plus one); the planner makes about one task per
cell and receiver group. The server refuses a request over its budget
(``--max-plan-cells``) before planning, runs a small one inline and a larger one in a
worker process (:mod:`reshard.service.workpool`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from reshard.errors import ReshardError
from reshard.layout import Layout
from reshard.service import wire
from reshard.service.v1 import reshard_pb2 as pb

INLINE_CELLS = 4096
"""Requests of at most this many cells are planned on the serving thread (a few ms);
larger ones in a worker process, where a deadline can stop them."""

INLINE_TENSORS = 1024
"""Requests of more tensors are sized, as well as planned, in a worker process."""

INLINE_DEVICES = 1024
"""Requests naming more devices (a mesh or the cluster) are sized, planned and costed
in a worker process: the lower bound's decomposition grows faster than linearly in the
devices (about 2 s at 4,096)."""


class OverBudget(ReshardError):
    """A request over one of the server's budgets (the service answers
    RESOURCE_EXHAUSTED)."""


def raw_counts(request: pb.PlanRequest) -> tuple[int, int]:
    """``(tensors, devices)`` of a request read off its message, before anything is
    built from it: how many tensors, and the most devices one of its meshes or its
    cluster names (a preset's own devices per host counted as 72, the most of any)."""
    most = 0
    for t in request.tensors:
        for lay in (t.src, t.dst):
            most = max(most, math.prod(lay.mesh.shape) if lay.mesh.shape else 0,
                       len(lay.mesh.devices))
    kind = request.cluster.WhichOneof("kind")
    if kind == "preset":
        c = request.cluster.preset
        most = max(most, c.num_hosts * (c.devices_per_host or 72))
    elif kind == "regular":
        c2 = request.cluster.regular
        most = max(most, c2.num_hosts * c2.devices_per_host)
    elif kind == "hosts":
        most = max(most, sum(len(h.devices) for h in request.cluster.hosts.hosts))
    return len(request.tensors), most


def check_tensors(what: str, tensors: int, max_tensors: int) -> None:
    """Refuse (:class:`OverBudget`) a request of more than ``max_tensors`` tensors."""
    if tensors > max_tensors:
        raise OverBudget(f"{what}: the request has {tensors} tensors, over the server's "
                         f"budget of {max_tensors} (--max-tensors); split it")


def _padded(what: str, entries: int, flags: str) -> OverBudget:
    fields = wire.FIELDS_PER_ENTRY * entries + wire.SPARE_FIELDS
    return OverBudget(f"{what}: the request has more than {fields} fields (counted before "
                      f"parsing: {wire.FIELDS_PER_ENTRY} an entry of {flags} ({entries}) and "
                      f"{wire.SPARE_FIELDS} more); send it without padding")


def check_plan_request_wire(what: str, raw: bytes, max_tensors: int) -> None:
    """Refuse a PlanRequest's bytes holding more than ``max_tensors`` tensors, counted
    on the wire before it is parsed (:mod:`reshard.service.wire`)."""
    if len(raw) <= 2 * max_tensors:
        return  # too short to hold more: each tensor takes at least two bytes
    try:
        tensors = wire.plan_request_tensors(raw, max_tensors)
    except wire.TooLong:
        raise _padded(what, max_tensors, "--max-tensors") from None
    if tensors > max_tensors:
        raise OverBudget(f"{what}: the request has more than {max_tensors} tensors (counted "
                         f"before parsing), over the server's budget of {max_tensors} "
                         f"(--max-tensors); split it")


def check_estimate_many_wire(raw: bytes, max_estimates: int, max_tensors: int) -> None:
    """Refuse an EstimateManyRequest's bytes holding more than ``max_estimates``
    requests, or more than ``max_tensors`` tensors in its requests together, counted on
    the wire before it is parsed."""
    if len(raw) <= 2 * min(max_estimates, max_tensors):
        return  # too short to hold more of either: each takes at least two bytes
    try:
        requests, tensors = wire.estimate_many_counts(raw, max_estimates, max_tensors)
    except wire.TooLong:
        raise _padded("EstimateMany", max_estimates + max_tensors,
                      "--max-estimates + --max-tensors") from None
    if requests > max_estimates:
        raise OverBudget(f"EstimateMany: the call has more than {max_estimates} requests "
                         f"(counted before parsing), over the server's budget of "
                         f"{max_estimates} (--max-estimates); send at most that many per call")
    if tensors > max_tensors:
        raise OverBudget(f"EstimateMany: the call's requests hold more than {max_tensors} "
                         f"tensors together (counted before parsing), over the server's "
                         f"budget of {max_tensors} (--max-tensors); send fewer per call")


def check_search_wire(raw: bytes, max_entries: int) -> None:
    """Refuse a SearchRequest's bytes holding more than ``max_entries`` layers,
    submeshes, candidates and edges together, counted on the wire before it is parsed."""
    if len(raw) <= 2 * max_entries:
        return  # too short to hold more: each takes at least two bytes
    try:
        n = wire.search_counts(raw, max_entries)
    except wire.TooLong:
        fields = wire.SEARCH_FIELDS_PER_ENTRY * max_entries + wire.SPARE_FIELDS
        raise OverBudget(f"Search: the request has more than {fields} fields (counted before "
                         f"parsing: {wire.SEARCH_FIELDS_PER_ENTRY} an entry of "
                         f"--max-search-candidates ({max_entries}) and {wire.SPARE_FIELDS} "
                         f"more); send it without padding") from None
    if n > max_entries:
        raise OverBudget(f"Search: the request has more than {max_entries} layers, submeshes, "
                         f"candidates and edges together (counted before parsing), over the "
                         f"server's budget of {max_entries} (--max-search-candidates); give "
                         f"fewer candidates, or search it in process (reshard.search)")


def check_counts(what: str, request: pb.PlanRequest, max_tensors: int,
                 max_devices: int) -> tuple[int, int]:
    """:func:`raw_counts`, refused (:class:`OverBudget`) over the server's budgets (the
    tensors counted first, before any is looked at)."""
    check_tensors(what, len(request.tensors), max_tensors)
    tensors, devices = raw_counts(request)
    if devices > max_devices:
        raise OverBudget(f"{what}: the request names {devices} devices (a mesh or its "
                         f"cluster), over the server's budget of {max_devices} "
                         f"(--max-devices); plan it in process (reshard.plan) or on a "
                         f"server with a larger budget")
    return tensors, devices


def check_estimates(requests: int, max_estimates: int) -> None:
    """Refuse (:class:`OverBudget`) an EstimateMany of more than ``max_estimates``
    requests."""
    if requests > max_estimates:
        raise OverBudget(f"EstimateMany: the call has {requests} requests, over the "
                         f"server's budget of {max_estimates} (--max-estimates); send at "
                         f"most {max_estimates} per call")


def check_cells(what: str, requests: Sequence[tuple[Any, ...]], max_cells: int) -> int:
    """:func:`request_cells`, refused (:class:`OverBudget`) over ``max_cells``."""
    cells = request_cells(requests)
    if cells > max_cells:
        raise OverBudget(
            f"{what}: the request's plan would have about {cells} cells (tasks), over the "
            f"server's budget of {max_cells} (--max-plan-cells); split it into smaller "
            f"requests")
    return cells

INLINE_TASKS = 4096
"""Plans of at most this many tasks are verified on the serving thread."""

REQUEST_WORK = 256
"""A request's (a tensor's) work besides its devices and cells, in cells: what decoding
it and the planner's fixed cost take (measured: a tiny 2 -> 2 move plans in about 4.6
ms, a 512 -> 512 S0 -> S0 move of 1,024 devices and 2,048 cells in about 58 ms)."""

INLINE_WORK = INLINE_CELLS + INLINE_DEVICES
"""The most work (:func:`work`) done on a serving thread for one call (about what one
inline Estimate may cost, ~0.1 s); more goes to a job worker."""


def work(tensors: int, devices: int, cells: int = 0) -> int:
    """A request's work in cells: :data:`REQUEST_WORK` a tensor, the most devices one of
    its meshes or its cluster names, and its plan's cells (0 before it is decoded: a
    lower bound)."""
    return REQUEST_WORK * max(1, tensors) + devices + cells


def _cuts(layout: Layout, dim: int, size: int) -> int:
    return min(size, layout.num_chunks(dim))


def tensor_cells(shape: Sequence[int], src: Layout, dst: Layout) -> int:
    """At most how many cells one tensor's decomposition has (at least 1)."""
    cells = 1
    for d, n in enumerate(shape):
        cells *= max(1, min(n, _cuts(src, d, n) + _cuts(dst, d, n)))
    groups = math.prod(src.mesh.shape[a] for a in src.spec.partial)
    return cells * max(1, groups)


def request_cells(requests: Sequence[tuple[Any, ...]]) -> int:
    """At most how many cells the plan of ``requests`` (``(shape, dtype, src, dst,
    ...)`` each, already checked) has, summed over its tensors."""
    return sum(tensor_cells(r[0], r[2], r[3]) for r in requests)


__all__ = ["INLINE_CELLS", "INLINE_DEVICES", "INLINE_TASKS", "INLINE_TENSORS", "INLINE_WORK",
           "REQUEST_WORK", "OverBudget", "check_cells", "check_counts",
           "check_estimate_many_wire", "check_estimates", "check_plan_request_wire",
           "check_search_wire",
           "check_tensors", "raw_counts", "request_cells", "tensor_cells", "work"]

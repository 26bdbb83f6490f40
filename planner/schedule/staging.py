"""Staging memory: what a plan's tasks hold on each device, and a byte budget for it.

A device runs a plan step by step (:mod:`reshard.comm.steps`); in each step every task
it takes part in gets its own region of one scratch buffer (a packed or received box,
a reduction's addend, an all-gather's input and rows; each region aligned to
:data:`ALIGN` bytes), sized for the step that needs most. A device's staging memory is
that fullest step's bytes.

:func:`fit_budget` bounds it: it cuts the steps whose staging would pass ``budget``
bytes on some device into consecutive smaller steps (**buckets**, filled first fit),
and splits a task whose box alone would pass it into pieces of whole
rows (then of whole elements) that fit, each a task of its own. A budget too small
for a single element of some task (or for an all-gather, which is not split) is
refused with the smallest budget that works. Megatron-Core's resharding batches its
transfers the same way (``execution_batch_bytes``); NCCL M2N stages through a fixed
pool of 256 MiB per communicator.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np

from reshard.dtypes import itemsize
from reshard.errors import ReshardError
from reshard.layout import Box, box_size
from reshard.planner.values.tasks import SUMMING, Conversion, Task, TaskKind

ALIGN = 64
"""Bytes each task's scratch region is aligned to (any dtype's view of it is aligned)."""


def region_bytes(n: int) -> int:
    """``n`` bytes rounded up to :data:`ALIGN`."""
    return -(-n // ALIGN) * ALIGN


def check_budget(budget: int | None) -> int | None:
    """``budget`` if it is None or a positive integer; else a ReshardError."""
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                               or budget < 1):
        raise ReshardError(f"memory_budget must be a positive number of bytes or None, got "
                           f"{budget!r}")
    return budget


def buffer_dtype(tensor: Conversion, task: Task) -> str:
    """The dtype of ``task``'s buffers: a reduction's accumulator, else what the wire
    carries (the destination dtype)."""
    if task.kind in SUMMING:
        return tensor.sum_dtype or tensor.dtype
    return tensor.out_dtype


def scratch_elems(task: Task, device: int) -> int:
    """Scratch elements ``task`` needs on ``device`` (a packed or received box, a
    reduce addend, an all-gather's input and rows)."""
    n = box_size(task.box)
    if task.kind is TaskKind.ALLGATHER:
        m = max((box_size(p) for p in task.pieces), default=0)
        return m * (len(task.receivers) + 1)
    if task.kind is TaskKind.COPY:
        return 0
    return n


def _parts(task: Task) -> tuple[Task, ...]:
    """What ``task`` stages as: a broadcast that sums addends, its two parts, and its
    sum's part once more for each running sum beyond the first that one member receives
    (a backend that fuses sums receives each apart: a star's root holds its own box and
    one per other addend)."""
    if not task.addends:
        return (task,)
    reduced, delivered = task.parts()
    fan_in = max(collections.Counter(p for _, p in task.sum_edges()).values())
    return (reduced, delivered, *[reduced] * (fan_in - 1))


def _slack(task: Task) -> int:
    """Bytes the alignment of ``task``'s regions may add to its payload."""
    return len(_parts(task)) * (ALIGN - 1)


def task_staging(task: Task, tensor: Conversion) -> int:
    """Bytes ``task`` stages on each of its devices (its region, aligned). A broadcast
    that sums addends counts as both its parts (a backend that does not fuse sums runs
    the reduction, in the accumulator dtype, in the same step), plus a region for each
    further running sum its busiest member receives (:func:`_parts`; charged to every
    member alike, so a budget holds on each)."""
    if task.kind is TaskKind.COPY:
        return 0
    return sum(region_bytes(scratch_elems(part, part.root) * itemsize(buffer_dtype(tensor, part)))
               for part in _parts(task))


def staging_by_device(tasks: Sequence[Task], tensors: Sequence[Conversion]) -> dict[int, int]:
    """Each device's staging bytes over a plan's ``tasks`` (steps contiguous in plan
    order): its fullest step's."""
    peak: dict[int, int] = {}
    for run in step_runs(tasks):
        use: dict[int, int] = {}
        for _, t in run:
            n = task_staging(t, tensors[t.tensor])
            for d in set(t.devices):
                use[d] = use.get(d, 0) + n
        for d, n in use.items():
            peak[d] = max(peak.get(d, 0), n)
    return peak


def split_box(box: Box, max_elems: int) -> list[Box]:
    """``box`` cut into boxes of at most ``max_elems`` elements (>= 1): runs of whole
    slabs along its first dim, a slab that alone is too big cut the same way along the
    next dims. In row-major order."""
    if box_size(box) <= max_elems or not box:
        return [box]
    (lo, hi), rest = box[0], box[1:]
    slab = box_size(rest)
    if slab <= max_elems:
        per = max(1, max_elems // slab)
        return [((a, min(a + per, hi)), *rest) for a in range(lo, hi, per)]
    return [((a, a + 1), *sub) for a in range(lo, hi) for sub in split_box(rest, max_elems)]


def _piece(task: Task, box: Box) -> Task:
    size = box_size(task.box)
    return replace(task, box=box, nbytes=task.nbytes * box_size(box) // max(1, size))


def step_runs(tasks: Sequence[Task]) -> Iterator[list[tuple[int, Task]]]:
    """A plan's tasks as runs of one step: ``(index in the plan, task)`` each (steps
    are contiguous in plan order)."""
    run: list[tuple[int, Task]] = []
    for i, t in enumerate(tasks):
        if run and t.step != run[-1][1].step:
            yield run
            run = []
        run.append((i, t))
    if run:
        yield run


def _per_element(task: Task, tensor: Conversion) -> int:
    """Staging bytes one element of ``task``'s box costs (before alignment)."""
    return sum(itemsize(buffer_dtype(tensor, part)) for part in _parts(task))


def fit_budget(tasks: Sequence[Task], tensors: Sequence[Conversion],
               budget: int, even: bool = True, sizes: Sequence[int] | None = None
               ) -> tuple[Task, ...]:
    """``tasks`` (a plan's, steps contiguous) rearranged so that no device stages more
    than ``budget`` bytes (:func:`staging_by_device`): each step that would stage more
    cut into buckets, consecutive steps (a step's tasks are independent, so any bucket
    order is valid). With ``even``, even buckets where they fit (:func:`_even`: every
    bucket about the same share of every device's bytes); else, and where those do not
    fit, first fit (:func:`_first_fit`: the plan's order kept). Which is faster depends
    on the plan (the planner costs both). Boxes too big alone are split (module
    docstring). Inside a bucket tasks keep their order; steps are renumbered
    from 0. ``sizes``: :func:`staging_sizes` of ``tasks``, where the caller has them.

    Raises:
        ReshardError: ``budget`` is too small for some task; names the smallest budget
            that works.
    """
    check_budget(budget)
    if sizes is None:
        sizes = staging_sizes(tasks, tensors)
    placed: list[tuple[int, int, Task]] = []  # (step, order, task)
    first = 0
    for run in step_runs(tasks):
        got = _even(run, tensors, budget, sizes) if even else None
        if got is None:
            got = _first_fit(run, tensors, budget, tasks, sizes)
        buckets = 0
        for k, piece in got:
            placed.append((first + k, len(placed), piece))
            buckets = max(buckets, k + 1)
        first += max(1, buckets)
    placed.sort(key=lambda p: (p[0], p[1]))
    return tuple(t.at_step(step) for step, _, t in placed)


def staging_sizes(tasks: Sequence[Task], tensors: Sequence[Conversion]) -> list[int]:
    """:func:`task_staging` of each of ``tasks``."""
    return [task_staging(t, tensors[t.tensor]) for t in tasks]


EVEN_TRIES = 4
"""Bucket counts :func:`_even` tries beyond the least that could fit."""

EVEN_PIECE = 4
""":func:`_even` cuts tasks into pieces of at most ``budget / EVEN_PIECE`` bytes."""

EVEN_UP_TO = 256
""":func:`_even` leaves steps that need more buckets than this to first fit (a tiny
budget: pieces would be many and small)."""


def _even(run: list[tuple[int, Task]], tensors: Sequence[Conversion],
          budget: int, staged: Sequence[int]) -> list[tuple[int, Task]] | None:
    """One step's tasks in ``k`` buckets that each hold about ``1/k`` of every device's
    bytes: ``(bucket, task or piece)`` each, or None where no ``k`` tried fits (an
    all-gather on a device over the budget, which is not split, or pieces too coarse).

    ``k`` starts at the least number of buckets the fullest device needs. Each task on a
    device over the budget is cut into pieces of at most ``budget / EVEN_PIECE`` bytes
    (whole rows where it can); largest first, each piece goes to the bucket where the
    fuller of its devices holds least (longest-processing-time balancing); every
    other task stays whole in bucket 0. The links that bound the step then stay busy in
    every bucket, where first fit can leave them idle in some.
    """
    use: collections.Counter[int] = collections.Counter()
    sizes = [staged[i] for i, _ in run]
    for (_, t), n in zip(run, sizes):
        use.update(dict.fromkeys(t.devices, n))
    peak = max(use.values(), default=0)
    if peak <= budget:
        return [(0, t) for _, t in run]
    least = -(-peak // budget)
    if least > EVEN_UP_TO:
        return None
    over = {d for d, n in use.items() if n > budget}
    parts = _even_parts(run, tensors, budget, sizes, over)
    if parts is None:
        return None
    whole, pieces = parts
    # each bucket's bytes per device as a (bucket, device) table: a piece goes to the
    # first bucket where the fullest of its devices holds least
    column = {d: c for c, d in enumerate(use)}
    cols: dict[tuple[int, ...], np.ndarray] = {}
    for _, _, _, _, devices in pieces:
        if devices not in cols:
            cols[devices] = np.fromiter((column[d] for d in devices), np.intp, len(devices))
    base = np.zeros(len(column), np.int64)  # the whole tasks' bytes, all in bucket 0
    for _, _, n, devices in whole:
        for d in devices:
            base[column[d]] += n
    for k in range(least, least + EVEN_TRIES):
        held = np.zeros((k, len(column)), np.int64)
        held[0] = base
        out: list[tuple[int, int, int, Task]] = [(order, 0, 0, t)
                                                 for order, t, _, _ in whole]
        for order, j, piece, m, devices in pieces:
            idx = cols[devices]
            b = int(held[:, idx].max(axis=1).argmin())
            held[b, idx] += m
            out.append((order, j, b, piece))
        if int(held.max()) <= budget:
            out.sort(key=lambda o: (o[0], o[1]))
            return [(b, t) for _, _, b, t in out]
    return None


_Whole = list[tuple[int, Task, int, tuple[int, ...]]]
"""Tasks kept whole: (order in the step, task, staging bytes, devices)."""

_Pieces = list[tuple[int, int, Task, int, tuple[int, ...]]]
"""Pieces to balance: (order in the step, piece number, piece, staging bytes, devices)."""


def _even_parts(run: list[tuple[int, Task]], tensors: Sequence[Conversion], budget: int,
                sizes: Sequence[int], over: set[int]) -> tuple[_Whole, _Pieces] | None:
    """:func:`_even`'s tasks: those on no device ``over`` the budget stay whole; the
    others cut into pieces of at most ``budget / EVEN_PIECE`` bytes, largest first
    (None: an all-gather there, which is not split, or not even one element fits)."""
    pieces: _Pieces = []
    whole: _Whole = []
    for order, ((_, t), n) in enumerate(zip(run, sizes)):
        tensor = tensors[t.tensor]
        devices = tuple(dict.fromkeys(t.devices))
        if over.isdisjoint(devices) or not n:
            whole.append((order, t, n, devices))
            continue
        if t.kind is TaskKind.ALLGATHER:
            return None
        room = budget // EVEN_PIECE - _slack(t)
        per = _per_element(t, tensor)
        if room < per:
            return None
        boxes = split_box(t.box, max(1, room // per)) if n > budget // EVEN_PIECE else [t.box]
        for j, box in enumerate(boxes):
            piece = t if len(boxes) == 1 else _piece(t, box)
            pieces.append((order, j, piece, n if piece is t else task_staging(piece, tensor),
                           devices))
    pieces.sort(key=lambda p: -p[3])  # stable: ties in plan order
    return whole, pieces


def _first_fit(run: list[tuple[int, Task]], tensors: Sequence[Conversion], budget: int,
               tasks: Sequence[Task], staged: Sequence[int]) -> list[tuple[int, Task]]:
    """One step's tasks in buckets filled first fit: a task (or piece) goes to the first
    bucket where each of its devices has room (a device's tasks do not wait behind
    buckets other devices filled); a task too big alone is cut into pieces of whole rows
    (or elements) that fit. ``tasks``: the whole plan's (for the error's smallest
    budget); ``staged``: their :func:`task_staging`."""
    use: list[collections.defaultdict[int, int]] = []
    out: list[tuple[int, Task]] = []
    for i, t in run:
        tensor = tensors[t.tensor]
        devices = tuple(dict.fromkeys(t.devices))
        n = staged[i]
        if n > budget:
            per = _per_element(t, tensor)
            room = budget - _slack(t)
            if t.kind is TaskKind.ALLGATHER or room < per:
                raise ReshardError(_too_small(budget, i, t, n, smallest_budget(
                    tasks, tensors)))
            pieces = [_piece(t, box) for box in split_box(t.box, room // per)]
        else:
            pieces = [t]
        for piece in pieces:
            m = n if piece is t else task_staging(piece, tensor)
            k = next((k for k, held in enumerate(use)
                      if max(map(held.__getitem__, devices)) + m <= budget), len(use))
            if k == len(use):
                use.append(collections.defaultdict(int))
            held = use[k]
            for d in devices:
                held[d] += m
            out.append((k, piece))
    return out


def smallest_budget(tasks: Sequence[Task], tensors: Sequence[Conversion]) -> int:
    """The smallest budget :func:`fit_budget` meets for these tasks: the largest staging
    of a single element (aligned) of a task, or of a whole all-gather."""
    least = ALIGN
    for t in tasks:
        tensor = tensors[t.tensor]
        if t.kind is TaskKind.ALLGATHER:
            least = max(least, task_staging(t, tensor))
        elif t.kind is not TaskKind.COPY:
            least = max(least, _per_element(t, tensor) + _slack(t))
    return least


def _too_small(budget: int, i: int, t: Task, need: int, smallest: int) -> str:
    what = ("an all-gather is not split" if t.kind is TaskKind.ALLGATHER
            else "not even one element fits")
    return (f"memory_budget of {budget} bytes is too small for task #{i} ({t}), which "
            f"stages {need} bytes on each of its devices ({what}); the smallest budget "
            f"that works for this plan is {smallest} bytes")


__all__ = ["ALIGN", "buffer_dtype", "check_budget", "fit_budget", "region_bytes",
           "scratch_elems", "smallest_budget", "split_box", "staging_by_device",
           "staging_sizes", "step_runs", "task_staging"]

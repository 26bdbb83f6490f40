"""The ``allgather`` baseline's receipts floor: the bytes each receiver takes in, a
quicker proof than the slices' whole floor.

An ``allgather`` plan (:func:`~reshard.planner.cells.cell_tasks.plan_allgather`) sends a
cell to each host of needers that do not hold it: whole to each receiver where a holder
is on the host or it has one receiver (across the receiver's NIC where no holder is on
its host), else a piece to each receiver across its NIC, which the receivers then
all-gather at the step after (each takes the others' pieces in and passes its own on).
Those receipts are the plan's whoever sends, so they are counted for every cell, the
sends out for none: they are a part of what
:func:`~reshard.planner.schedule.floors.baseline_floor` counts (which adds a single
holder's sends, the reductions and the point-to-point rows), priced the same way
(:func:`~reshard.planner.schedule.floors.load_floor`: a floor only grows with its
loads), so no higher than it. Counted in one dict, not as the whole floor's ordered
rows: on the 4x8 cold set's sources of one holder a cell (S01R -> RR) it costs a small
part of the whole floor and rules the baseline out where the whole floor does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import partial

from reshard.cluster import Cluster
from reshard.planner.schedule.floors import StepLoads, load_floor
from reshard.planner.schedule.held_receipts import (
    HostReceivers,
    PieceSizes,
    held_receipts,
    host_receivers,
    piece_sizes,
)
from reshard.planner.schedule.work import WorkList

RECEIPTS_UP_TO = 1 << 16
"""The most receivers (each general cell's needers, summed) whose receipts
:func:`receipts_floor` counts; above it the floor is 0.0 (never wrong: it is asked only
as a quicker proof, and :meth:`~reshard.planner.builds.Builds.beaten` then asks the whole
floor, whose array path serves large cells). The 4x8 cold set asks at most 1,024; S10R
-> RR at 1,024 devices asks 1,048,576 (1,024 cells of 1,024 receivers), which counted
one by one took 3.6 s of CPU, twice the rest of that request."""

def receipts_floor(work: WorkList, itemsizes: Sequence[int], cluster: Cluster) -> float:
    """Seconds no ``allgather`` plan of ``work``'s slices (``itemsizes``: each tensor's
    bytes per element) takes less than in the cost model, from its general cells'
    receipts alone (module docstring); 0.0 where they have more than
    :data:`RECEIPTS_UP_TO` receivers."""
    if sum(len(cell.needers) for _, cell in work.general) > RECEIPTS_UP_TO:
        return 0.0
    return load_floor(receipts(work, itemsizes, cluster), cluster)


def receipts(work: WorkList, itemsizes: Sequence[int], cluster: Cluster) -> StepLoads:
    """The bytes :func:`receipts_floor` counts, by resource kind and (index, step)."""
    host, nic = cluster.host_map, cluster.nic_map
    load: StepLoads = defaultdict(float)
    known: dict[tuple[frozenset[int], frozenset[int]], HostReceivers] = {}
    split: PieceSizes = {}
    cell_steps, _ = work.steps()
    for (tensor, cell), step in zip(work.general, cell_steps):
        item = itemsizes[tensor]
        nbytes = cell.size * item
        if not nbytes or cell.needers <= cell.holders:
            continue
        hosts = known.get((cell.holders, cell.needers))
        if hosts is None:
            hosts = known[(cell.holders, cell.needers)] = host_receivers(
                sorted(cell.needers - cell.holders), cell.holders, host)
        pieces = partial(piece_sizes, cell.box, item=item, known=split)
        for kind, index, at, b in held_receipts(hosts, nbytes, step, nic, pieces):
            load[(kind, (index, at))] += b
    return load


__all__ = ["RECEIPTS_UP_TO", "receipts", "receipts_floor"]

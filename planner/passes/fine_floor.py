"""``finer``'s floor: seconds the cost model cannot put a ``broadcast`` plan of plain
sources below, read from the request's cells alone (no fine slice cut or planned).

A plain source's fine cut has the coarse cut's cells (only a partial source's
reductions change, :func:`~reshard.planner.cuts.cut_key`); the fine slices cut each
into more pieces, every piece with its cell's holders and needers. The planner delivers
a piece to the needers that do not hold it in one broadcast from one holder, a chain (a
task without ``parents``: only the ``trees`` pass reshapes chains into trees), which
reaches every receiver one hop after another. So:

* every byte of a cell that some device of host ``h`` needs and no device of ``h``
  holds crosses one of ``h``'s NICs in (a hop from another host), whose capacities sum
  to ``nic_bandwidth``; and
* the model moves a task's bytes only once its latency has passed (its deepest
  receiver's reach: for a chain, the sum of its hops), and a chain to the receivers
  ``R`` of a cell enters each host of ``R`` that holds none of it over at least one
  network hop (``latency``) and reaches the rest over at least one hop each (the
  least of ``latency`` and ``intra_latency``).

No byte of those cells enters ``h`` before the least of those latencies over the cells
``h`` needs, and then at most at ``nic_bandwidth``: the plan lasts at least that
latency plus the bytes over the bandwidth (:func:`fine_floor`, the largest over the
hosts). Relay fills, conversions, steps and other bytes on the NICs only add. Where
the first plan already sits at that floor (a destination replicated inside each
host, 8192 x 8192 on 4x8 dgx-h100: the fine plan is the same chains halved), the
``finer`` pass builds nothing (:mod:`reshard.planner.passes.stages`).
"""

from __future__ import annotations

from collections.abc import Iterable

from reshard.cluster import Cluster
from reshard.planner.cells.decompose import Cell, CellTable

MARGIN = 1e-9
"""The floor is reported this much (relative) below its sum: the model's own float
sums may land an ulp under the exact floor."""


def fine_floor(per_tensor: Iterable[tuple[list[Cell] | CellTable, int]],
               cluster: Cluster) -> float:
    """Seconds no ``broadcast`` plan of these cells (per tensor, with its itemsize) is
    modelled below, every cell delivered in one chain per piece (see the module
    docstring); 0 where no host must take any bytes in."""
    host = cluster.host_of
    hop = min(cluster.latency, cluster.intra_latency)
    into: dict[int, int] = {}  # bytes each host takes in through its NICs
    first: dict[int, float] = {}  # the least latency of a chain bringing them
    for (holders, needers), nbytes in _grouped(per_tensor).items():
        receivers = needers - holders
        entered = {host(d) for d in receivers} - {host(d) for d in holders}
        if not entered or not nbytes:
            continue
        reach = cluster.latency * len(entered) + hop * (len(receivers) - len(entered))
        for h in entered:
            into[h] = into.get(h, 0) + nbytes
            if reach < first.get(h, float("inf")):
                first[h] = reach
    best = max((first[h] + into[h] / cluster.nic_bandwidth for h in into), default=0.0)
    return best * (1 - MARGIN)


def _grouped(per_tensor: Iterable[tuple[list[Cell] | CellTable, int]]
             ) -> dict[tuple[frozenset[int], frozenset[int]], int]:
    """Bytes of the cells by (holders, needers), a table's read from its columns."""
    out: dict[tuple[frozenset[int], frozenset[int]], int] = {}
    for cells, itemsize in per_tensor:
        if isinstance(cells, CellTable):
            rows = zip(cells.holder.tolist(), cells.needer.tolist(), cells.size.tolist())
            for h, n, size in rows:
                key = (cells.holder_sets[h], cells.needer_sets[n])
                out[key] = out.get(key, 0) + size * itemsize
            continue
        for cell in cells:
            key = (cell.holders, cell.needers)
            out[key] = out.get(key, 0) + cell.size * itemsize
    return out


__all__ = ["MARGIN", "fine_floor"]

"""The ``send_recv`` baseline's host floor: a host's NICs carry every copy it sends out.

A ``send_recv`` plan sends a cell to each needer that does not hold it, from one of its
holders, in its own transfer (:func:`~reshard.planner.cells.cell_tasks.plan_send_recv`:
``pick_sender`` picks a holder, ``_send`` sends directly; the bulk paths of a cell table
send the same way). A needer on a host none of the holders is on receives its copy
across the host boundary: the transfer crosses ``NIC_OUT`` of a NIC of a holder's host
(its sender's, :func:`~reshard.planner.costing.cost.task_path`) with the whole of its
bytes. So for a set of hosts, the cells whose holders all lie on those hosts send each
needer on none of them a copy through those hosts' NICs: however the senders are
picked, the NICs carry at least the sum over such cells and needers, and the busiest of
them at least that sum over their number (the floor takes the most loaded set, each
set's cells counted with its subsets'). The model shares a resource at most at its
capacity, and a transfer flows only once its latency has passed (at least the cluster's
least latency, as :func:`~reshard.planner.schedule.floors.baseline_floor` counts it): no
plan of those sends ends sooner than that many bytes over the NICs' capacity, after that
latency.

The slices' floor (:func:`~reshard.planner.schedule.floors.baseline_floor`) counts a
sender's bytes only where a slice has one holder; a replicated source (``S0R``, each
row block on a whole host) leaves it the receivers' loads, while point to point each of
the other hosts' devices takes its own copy out of the holding hosts: on the 4x8 cold set
``S0R -> RR`` the ``send_recv`` plan is 7.8x the plan kept, its slices' floor below it.

A partial source's cells are its reduced pieces, held by the reductions' roots, which
the cut chose (:func:`~reshard.planner.cuts.cut_cells`): every ``send_recv`` plan of that
cut sends them from those roots, so the floor of a cut holds for its plans (the coarse
cut's and the fine one's are found apart, as the slices' floors are). What ``send_recv``'s
search changes within a cut keeps these bytes: ``least-concurrent`` moves the same sends
between steps; ``finer`` plans the fine cut, floored by its own cells.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.cells.decompose import Cell, CellTable
from reshard.planner.schedule.floors import FLOOR_MARGIN
from reshard.planner.values.resources import NIC_OUT, capacities


def _groups(cells: list[Cell] | CellTable) -> Iterator[tuple[frozenset[int], frozenset[int],
                                                             float]]:
    """``(holders, needers, elements)`` of ``cells``, summed per distinct pair of sets
    (as floats: a floor, never compared without its margin)."""
    if isinstance(cells, CellTable):
        if not len(cells):
            return
        width = len(cells.needer_sets)
        pairs, where = np.unique(cells.holder.astype(np.int64) * width + cells.needer,
                                 return_inverse=True)
        sums = np.bincount(where.ravel(), weights=cells.size.astype(np.float64))
        for pair, s in zip(pairs.tolist(), sums.tolist()):
            yield cells.holder_sets[pair // width], cells.needer_sets[pair % width], s
    else:
        by_pair: dict[tuple[frozenset[int], frozenset[int]], float] = {}
        for cell in cells:
            key = (cell.holders, cell.needers)
            by_pair[key] = by_pair.get(key, 0.0) + cell.size
        for (holders, needers), s in by_pair.items():
            yield holders, needers, s


def bytes_out(cells_of: Iterable[tuple[list[Cell] | CellTable, int]],
              host: Callable[[int], int]) -> dict[frozenset[int], float]:
    """Bytes the NICs of each set of hosts must send out point to point: per cell, its
    bytes (elements times the tensor's ``itemsize``) once per needer on none of its
    holders' hosts, under the set of those hosts. ``cells_of``: each tensor's cells of
    one cut, and its itemsize. A set of holders' hosts and a set of needers' count per
    host are found once per distinct set (a 1,024-device cut repeats them cell after
    cell)."""
    out: dict[frozenset[int], float] = {}
    hosts_of: dict[frozenset[int], frozenset[int]] = {}
    per_host: dict[frozenset[int], Counter[int]] = {}
    for cells, itemsize in cells_of:
        for holders, needers, size in _groups(cells):
            hosts = hosts_of.get(holders)
            if hosts is None:
                hosts = hosts_of[holders] = frozenset(map(host, holders))
            count = per_host.get(needers)
            if count is None:
                count = per_host[needers] = Counter(map(host, needers))
            away = _away(count, hosts)
            if away and size:
                out[hosts] = out.get(hosts, 0.0) + away * size * itemsize
    return out


def _away(count: Counter[int], hosts: frozenset[int]) -> int:
    """How many needers (``count``: per host) are on none of ``hosts``: an integer,
    counted over whichever of the two is smaller."""
    if len(hosts) < len(count):
        return count.total() - sum(count.get(h, 0) for h in hosts)
    return sum(c for h, c in count.items() if h not in hosts)


def send_floor(cells_of: Iterable[tuple[list[Cell] | CellTable, int]],
               cluster: Cluster) -> float:
    """Seconds no ``send_recv`` plan of these cells (each tensor's cells of one cut, with
    its itemsize) can be modelled below (module docstring): per set of hosts, the bytes
    its NICs must send out (its own and its subsets') over their capacity; less
    :data:`~reshard.planner.schedule.floors.FLOOR_MARGIN`; 0 where no host must send."""
    out = bytes_out(cells_of, cluster.host_of)
    if not out:
        return 0.0
    cap = capacities(cluster)[NIC_OUT]
    busiest = max(sum(b for inner, b in out.items() if inner <= hosts) /
                  (len({cluster.nic_of(d) for h in hosts for d in cluster.hosts[h]}) * cap)
                  for hosts in out)
    wait = min(cluster.latency, cluster.intra_latency)
    return (busiest + wait) * (1 - FLOOR_MARGIN)


__all__ = ["bytes_out", "send_floor"]

"""When the ``allgather`` baseline is the ``send_recv`` baseline, task for task.

The default strategy's planner also plans the two baselines, ``send_recv`` then
``allgather`` (:func:`reshard.planner.plan._best_plan`), and keeps one only where the
model says it is faster than the best so far. On a partial source the ``allgather``
baseline is planned in full (its floor seldom rules it out), and in about two of three
such requests of the 4x8 cold set its plan is the ``send_recv`` baseline's own tasks.
:func:`gathers_as_sends` shows that from the cells alone, before anything is built.

The two strategies plan the same slices of a cut (neither splits a cell for balance:
:func:`~reshard.planner.cuts.cut_slices`) through the same work list (no expected
demand, no relays, no fan-out: those are the broadcast's); only the cell planner
differs (:mod:`reshard.planner.cells.cell_tasks`). Of one cell:

* both copy the cell to each needer that holds it, in id order, first;
* ``plan_send_recv`` then sends it to each other needer in id order, from
  ``pick_sender(holders, needer)``, which is ``pick_root(holders, {its host})``;
* ``plan_allgather`` goes host by host in host order; a host with one such needer and
  no holder gets one send from ``pick_root(holders, {that host})``, charged the same
  way; a host with one holder and one needer too (the holder is then the root either
  way: ``pick_root`` of one holder is that holder).

So where every cell's needers that do not hold it are on distinct hosts, their hosts
in the same order as their ids, and no such host holds the cell unless the cell has a
single holder (:func:`cell_as_sends`), both planners give the same tasks and charge the
same loads in the same order, cell after cell: the two plans are equal, and so is
every plan either search builds from them (a non-broadcast search reads its first plan
and its ``finer`` build, both equal where the fine cut passes the test too; the passes
that read the strategy, ``fan-out``, ``fused`` and ``point-to-point``, propose nothing
to either; a ``finer`` build ``send_recv`` leaves unbuilt for size has as many tasks
as the one ``allgather`` builds, more than ``finer`` keeps). The ``allgather``
baseline's plan is then the ``send_recv`` baseline's, the same model time: where that
baseline was planned, the best so far is no slower than it (it was kept or not faster),
and where its floor ruled it out, no plan its search could keep beats the best; either
way ``faster`` (strict) does not keep the ``allgather`` plan, so it is not built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import pairwise

from reshard.planner.cells.decompose import Cell, CellTable


def cell_as_sends(holders: frozenset[int], needers: frozenset[int],
                  host: Callable[[int], int],
                  spread: dict[frozenset[int], frozenset[int] | None] | None = None) -> bool:
    """Whether ``plan_allgather`` plans a cell of these holders and needers as
    ``plan_send_recv`` does (module docstring): its needers that do not hold it on
    distinct hosts, in host order as in id order, none on a host of a holder unless it
    has one holder. ``spread``: a memo of :func:`_spread` (by the needers left)."""
    rest = needers - holders if not needers.isdisjoint(holders) else needers
    if spread is None:
        hosts = _spread(rest, host)
    elif rest in spread:
        hosts = spread[rest]
    else:
        hosts = spread[rest] = _spread(rest, host)
    if hosts is None:
        return False
    return len(holders) == 1 or hosts.isdisjoint([host(d) for d in holders])


def _spread(rest: frozenset[int], host: Callable[[int], int]) -> frozenset[int] | None:
    """The hosts of ``rest`` where each has one of them and their hosts rise with their
    ids (the order both planners send in), else None."""
    hosts = [host(n) for n in sorted(rest)]
    for a, b in pairwise(hosts):
        if a >= b:
            return None
    return frozenset(hosts)


def _pairs(cells: list[Cell] | CellTable) -> Iterator[tuple[frozenset[int], frozenset[int]]]:
    """The (holders, needers) of ``cells`` (each distinct pair of a table once)."""
    if isinstance(cells, CellTable):
        seen = set(zip(cells.holder.tolist(), cells.needer.tolist()))
        for h, n in sorted(seen):
            yield cells.holder_sets[h], cells.needer_sets[n]
    else:
        for cell in cells:
            yield cell.holders, cell.needers


def gathers_as_sends(tensors_cells: Iterable[list[Cell] | CellTable],
                     host: Callable[[int], int]) -> bool:
    """Whether every cell of ``tensors_cells`` (each tensor's cells of the cuts the
    baselines' searches plan from, :attr:`~reshard.planner.cuts.Cut.cells`) passes
    :func:`cell_as_sends` on the hosts ``host`` gives (the cuts' loads', which the
    planners read), each distinct pair of holders and needers tested once: then the
    ``allgather`` baseline's plans of those cuts are the ``send_recv`` baseline's."""
    known: dict[tuple[frozenset[int], frozenset[int]], bool] = {}
    spread: dict[frozenset[int], frozenset[int] | None] = {}
    for cells in tensors_cells:
        for key in _pairs(cells):
            got = known.get(key)
            if got is None:
                got = known[key] = cell_as_sends(key[0], key[1], host, spread)
            if not got:
                return False
    return True


__all__ = ["cell_as_sends", "gathers_as_sends"]

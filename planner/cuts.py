"""A planning call's cells cut into slices, before any is planned.

Every strategy's plan of the same tensors starts from the same cells: each tensor's
unit-slice cells (a partial source's reduced first, :func:`cut_cells`, once a call:
:class:`Cut`), then split for balance over the NICs where a strategy broadcasts and put
in a work list (:func:`cut_slices`: :class:`Slices`, planned later by
:mod:`reshard.planner.plan`, which keeps both a call long).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reshard.cluster import Cluster
from reshard.layout import Box, Layout, box_size, chunk_size
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.cell_tasks import CELL_PLANNERS, fan_out, split_box, split_dim
from reshard.planner.cells.decompose import (
    CELLS_FROM,
    TABLE_FROM,
    Cell,
    CellTable,
    decompose,
    decompose_table,
    devices_by_box,
    new_cell,
)
from reshard.planner.cells.reduce import decompose_pieces, point_rows, reduce_sources
from reshard.planner.schedule.device_arrays import DeviceArrays, device_arrays
from reshard.planner.schedule.send_columns import OrderedTasks
from reshard.planner.schedule.work import Splitter, WorkList
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task, TensorSpec

FINE_SPLIT = 16
"""A plan built with ``fine`` splits cells into pieces this many times smaller than
:func:`min_piece` (at least 64 KiB): where one NIC per receiver would carry a whole
small cell, pieces over every NIC of the host and a hop inside it beat the latency
the coarse pieces save (the planner costs both, :mod:`reshard.planner.passes.stages`)."""


def balance_piece(cluster: Cluster, fine: bool = False) -> int:
    """Smallest piece a cell is split into for balance: long enough that a NIC's
    latency costs at most a quarter of its transfer time (and at least 64 KiB);
    ``fine``: :data:`FINE_SPLIT` times smaller."""
    piece = int(4 * cluster.latency * cluster.nic_capacity)
    return max(1 << 16, piece // FINE_SPLIT if fine else piece)


def _split_in(cell: Cell, k: int) -> list[Cell]:
    """``cell`` cut into ``k`` pieces (:func:`split_box`; whole where ``k`` < 2)."""
    if k < 2:
        return [cell]
    holders, needers = cell.holders, cell.needers  # new_cell: Cell's fields and size
    pieces = [new_cell(b, holders, needers) for b in split_box(cell.box, k)]
    return [piece for piece in pieces if piece.size]  # size: box_size of its box


def _balance_pieces(cell: Cell, nbytes: int, loads: Loads, min_piece: int,
                    need_nics: dict[frozenset[int], int] | None = None) -> int:
    """How many pieces to cut a cell of ``nbytes`` into to balance it over NICs (1:
    none): as many as the NICs its holders can send through, or the NICs a needing
    host can receive it through, whichever is more (at most 16; every piece at least
    ``min_piece`` bytes). Read from its holders, needers and bytes alone (the devices'
    hosts and NICs, not the loads). ``need_nics``: a memo of :func:`_need_nics` (the
    same answer, found once per distinct set of needers that hold nothing)."""
    if nbytes < 2 * min_piece:
        return 1
    hold_nics = len({loads.nic(d) for d in cell.holders})
    need = (cell.needers if cell.holders.isdisjoint(cell.needers)
            else cell.needers - cell.holders)
    known = need_nics.get(need) if need_nics is not None else None
    if known is None:
        known = _need_nics(need, loads)
        if need_nics is not None:
            need_nics[need] = known
    most = known
    k = min(16, max(hold_nics, most), nbytes // min_piece)
    return 1 if k < 2 or not need else k


def _need_nics(need: frozenset[int], loads: Loads) -> int:
    """The most NICs one host of ``need`` receives through (1 where ``need`` is
    empty)."""
    nic = loads.nic
    per_host: dict[int, set[int]] = {}
    for d in need:
        per_host.setdefault(loads.host(d), set()).add(nic(d))
    return max((len(v) for v in per_host.values()), default=1)


class LayoutBoxes:
    """The devices of each distinct box of a layout for a shape, computed once per
    planning call (tensors of one shape often share a layout)."""

    def __init__(self) -> None:
        self._known: dict[tuple[Any, ...], dict[Box, frozenset[int]]] = {}

    def holders(self, t: TensorSpec) -> dict[Box, frozenset[int]]:
        """The devices holding each source box (partial sources: not yet reduced)."""
        return self._get(t.src, t.shape, None)

    def needers(self, t: TensorSpec) -> dict[Box, frozenset[int]]:
        """Devices that must receive each destination box (partial: only the leaders;
        the other addends stay zero)."""
        return self._get(t.dst, t.shape, t.dst.partial_leaders() if t.dst.spec.is_partial
                         else None)

    def _get(self, layout: Layout, shape: tuple[int, ...],
             only: frozenset[int] | None) -> dict[Box, frozenset[int]]:
        key = (layout, shape, only)
        got = self._known.get(key)
        if got is None:
            got = self._known[key] = devices_by_box(layout, shape, only)
        return got


@dataclass
class Slices:
    """A planning call's slices, cut but not yet planned (:func:`cut_slices`): the
    partial sums' reductions, and every cell to move in the work list."""

    cluster: Cluster
    strat: Strategy
    work: WorkList
    reduces: list[Task]
    itemsizes: list[int]

    def least_tasks(self) -> int:
        """Tasks the plan will have at the least: every reduction, and what each slice
        gives at the least (:meth:`WorkList.least_tasks`)."""
        return len(self.reduces) + self.work.least_tasks(self.strat is Strategy.SEND_RECV)

    def plan(self, fan_out: bool) -> tuple[OrderedTasks, bool]:
        """Every slice planned, largest first (:meth:`WorkList.plan`): the tasks in the
        global order, and whether some broadcast of a reduced piece could fan out."""
        broadcast = self.strat is Strategy.BROADCAST
        tasks = self.work.plan(CELL_PLANNERS[self.strat], self.itemsizes,
                               expect=broadcast and self.cluster.nics_per_host > 1,
                               relays=broadcast, fan_out=fan_out, first=self.reduces)
        return tasks, self.pipelined()

    def assemble(self, fan_out: bool) -> tuple[OrderedTasks, bool]:
        """:meth:`plan` again, fanned out as ``fan_out`` says, from the choices it made
        (fanning out changes no choice: :meth:`WorkList.assemble`)."""
        return self.work.assemble(fan_out), self.pipelined()

    def pipelined(self) -> bool:
        """Whether some broadcast of a reduced piece could fan out."""
        return self.strat is Strategy.BROADCAST and any(r.step > 0 for r in self.reduces)

    def splits_chains(self) -> bool:
        """Whether :meth:`assemble` with ``fan_out`` would split some chain (planned
        first; :meth:`WorkList.fanned`, the general slices it fans out): where not, the
        fanned plan is the plan not fanned out, task for task."""
        host = self.work.loads.host  # as assemble splits; a split chain is two tasks
        return any(len(fan_out(tasks, host)) > len(tasks) for tasks in self.work.fanned())


@dataclass(frozen=True)
class Cut:
    """The cells of a planning call's tensors, before any strategy's choice
    (:func:`cut_cells`): per tensor its cells and the step each may start at; the
    partial sums' reductions; the loads those put on the cluster; each device's host
    and NIC as arrays (:func:`~reshard.planner.schedule.device_arrays.device_arrays`,
    fill 0), built once for every strategy's work list (None: each builds its own)."""

    cells: tuple[list[Cell] | CellTable, ...]
    after: tuple[Sequence[int] | np.ndarray, ...]
    reduces: tuple[Task, ...]
    loads: Loads
    devices: DeviceArrays | None = None  # the cluster's, for every work list of the cut


def least_tasks(cut: Cut, cluster: Cluster, strat: Strategy, itemsizes: Sequence[int],
                fine: bool = False) -> int | None:
    """:meth:`Slices.least_tasks` of ``strat``'s slices of ``cut`` (:func:`cut_slices`
    with these arguments), counted before they are cut: a cell that ``broadcast``
    splits for balance counts once a non-empty piece (each piece has the cell's holders
    and needers), no piece built. None where a tensor's cells are a table of
    :data:`CELLS_FROM` rows or more (not counted here)."""
    point_to_point = strat is Strategy.SEND_RECV
    min_piece = balance_piece(cluster, fine)
    cells = 0
    known: dict[tuple[frozenset[int], frozenset[int]], int] = {}  # by holders, needers
    for per_tensor, item in zip(cut.cells, itemsizes):
        if isinstance(per_tensor, CellTable):  # a small one: its columns, then its cells
            if len(per_tensor) >= CELLS_FROM:
                return None
            rows, per_tensor = point_rows(per_tensor)
            cells += rows
        pieces = _piece_count(item, cut.loads, min_piece) if strat is Strategy.BROADCAST \
            else None
        for cell in per_tensor:
            key = (cell.holders, cell.needers)
            each = known.get(key)
            if each is None:
                held = len(cell.needers & cell.holders)
                rest = len(cell.needers) - held
                each = known[key] = held + (rest if point_to_point else min(rest, 1))
            cells += each if pieces is None else each * pieces(cell)
    return len(cut.reduces) + cells


def same_slices(coarse: Cut, fine: Cut, cluster: Cluster, strat: Strategy,
                itemsizes: Sequence[int]) -> bool:
    """Whether ``strat``'s slices of the ``fine`` cut are shown, from the two cuts alone,
    to be those of the ``coarse`` one (:func:`cut_slices` of each, their signatures
    equal): the same reductions, the same cells and steps, and, under ``broadcast``,
    each cell cut into the same pieces by both cuts' balance pieces. False where that
    is not shown (tables compared column by column), not a proof of a difference."""
    if coarse.reduces != fine.reduces:
        return False
    for a, b, after_a, after_b in zip(coarse.cells, fine.cells, coarse.after, fine.after):
        if isinstance(a, CellTable) or isinstance(b, CellTable):
            if not (isinstance(a, CellTable) and isinstance(b, CellTable)
                    and _same_table(a, b)):
                return False
        elif a is not b and a != b:
            return False
        if after_a is not after_b and not _same_steps(after_a, after_b):
            return False
    if strat is not Strategy.BROADCAST:
        return True  # cut only for balance under broadcast
    small, least = balance_piece(cluster), balance_piece(cluster, True)
    for cells, item in zip(coarse.cells, itemsizes):
        whole, finer = _pieces(item, coarse.loads, small), _pieces(item, fine.loads, least)
        for cell in (cells.cells() if isinstance(cells, CellTable) else cells):
            nbytes = cell.size * item
            k, j = whole(cell, nbytes), finer(cell, nbytes)
            if k != j and _piece_boxes(cell.box, k) != _piece_boxes(cell.box, j):
                return False
    return True


def _same_steps(a: Any, b: Any) -> bool:
    """Whether two cells' steps (lists, or a table's array) are equal."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    return list(a) == list(b)


def _same_table(a: CellTable, b: CellTable) -> bool:
    """Whether two tables hold the same cells in the same order (same columns and sets)."""
    return a is b or (a.holder_sets == b.holder_sets and a.needer_sets == b.needer_sets
                      and all(np.array_equal(x, y) for x, y in
                              ((a.lo, b.lo), (a.hi, b.hi), (a.holder, b.holder),
                               (a.needer, b.needer))))


def _piece_boxes(box: Box, k: int) -> list[Box]:
    """The boxes of :func:`_split_in`'s cells."""
    return [box] if k < 2 else [b for b in split_box(box, k) if box_size(b)]


def cut_cells(tensors: tuple[TensorSpec, ...], cluster: Cluster, fuse: bool = False,
              fine: bool = False, like: Cut | None = None) -> Cut:
    """Each tensor's cells (a partial source's reduced first): what every strategy's
    slices are cut from (:func:`cut_slices`). ``fuse`` and ``fine`` change only the
    reductions (:func:`cut_key`). ``like``: a cut of the same tensors and cluster whose
    reductions were cut otherwise (``fine`` or not): a tensor whose reductions come out
    the same takes its cells and steps from it (they depend on nothing else)."""
    loads = Loads(cluster)
    reduces: list[Task] = []
    min_piece = balance_piece(cluster, fine)
    same: dict[tuple[Any, ...], list[Cell] | CellTable] = {}  # tensors of one shape and layouts
    boxes = LayoutBoxes()
    per_tensor: list[list[Cell] | CellTable] = []
    afters: list[Sequence[int] | np.ndarray] = []
    for i, t in enumerate(tensors):
        key = (t.shape, t.src, t.dst)
        cells = same.get(key)
        ready: dict[Box, int] = {}
        steps: list[int] | np.ndarray = []
        if cells is None:
            needers = boxes.needers(t)
            if t.src.spec.is_partial:
                holders, tensor_reduces = reduce_sources(t, i, loads, needers, min_piece,
                                                         whole=fuse and t.fuses)
            else:
                holders, tensor_reduces = boxes.holders(t), []
            reduces.extend(tensor_reduces)
            ready = {r.box: r.step + 1 for r in tensor_reduces}
            if ready and like is not None and _same_reductions(like, i, tensor_reduces):
                cells, steps = like.cells[i], list(like.after[i])
            elif ready:
                cells, steps = decompose_pieces(t.shape, holders, needers, ready,
                                                table=not cluster.shared_bandwidth)
            elif len(holders) * len(needers) >= TABLE_FROM:
                cells = decompose_table(t.shape, holders, needers)
            else:
                cells = decompose(t.shape, holders, needers)
            if not tensor_reduces:  # reduce roots follow the loads: not reusable
                same[key] = cells
        per_tensor.append(cells)
        if isinstance(cells, CellTable):  # a partial source's with its steps
            afters.append(np.asarray(steps, np.int64) if ready else
                          np.zeros(len(cells), np.int64))
        else:
            afters.append(steps if ready else [0] * len(cells))
    return Cut(tuple(per_tensor), tuple(afters), tuple(reduces), loads,
               device_arrays(cluster, 0))


def _same_reductions(cut: Cut, tensor: int, reduces: list[Task]) -> bool:
    """Whether ``cut``'s reductions of ``tensor`` are ``reduces`` (in order)."""
    mine = [r for r in cut.reduces if r.tensor == tensor]
    return mine == reduces and isinstance(cut.cells[tensor], (list, CellTable))


def cut_key(tensors: tuple[TensorSpec, ...], fuse: bool, fine: bool) -> tuple[bool, bool]:
    """What of ``fuse`` and ``fine`` changes :func:`cut_cells`: only a partial
    source's reductions read them (``fuse``: of a tensor that fuses)."""
    partial = [t for t in tensors if t.src.spec.is_partial]
    return fuse and any(t.fuses for t in partial), fine and bool(partial)


def cut_slices(tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy,
               fuse: bool = False, fine: bool = False, cut: Cut | None = None) -> Slices:
    """The slices of a plan of ``tensors`` (:func:`ordered_tasks`' arguments): each
    tensor's cells (:func:`cut_cells`; ``cut``: found already, for the same
    ``tensors``, ``cluster`` and :func:`cut_key`), split for balance under
    ``broadcast``, in a work list."""
    if cut is None:
        cut = cut_cells(tensors, cluster, fuse, fine)
    loads = cut.loads.copy()  # the cut's own stay as the reductions left them
    work = WorkList(cluster, loads, cut.devices)
    broadcast = strat is Strategy.BROADCAST
    min_piece = balance_piece(cluster, fine)
    itemsizes = [t.itemsize for t in tensors]
    for i, (cells, after) in enumerate(zip(cut.cells, cut.after)):
        split = _splitter(itemsizes[i], loads, min_piece) if broadcast else None
        if isinstance(cells, CellTable):
            work.add_table(i, cells, itemsizes[i], np.asarray(after), split,
                           whole_below=2 * min_piece)  # as _splitter leaves them whole
        elif isinstance(after, np.ndarray):  # a table's steps: never beside a cell list
            raise TypeError("a list of cells came with a table's steps")
        else:
            work.add_cells(i, cells, itemsizes[i], after, split, whole_below=2 * min_piece)
    return Slices(cluster, strat, work, list(cut.reduces), itemsizes)


def _splitter(itemsize: int, loads: Loads, min_piece: int) -> Splitter:
    """Cells of one tensor cut for balance (:func:`_balance_pieces`; cells under two
    minimal pieces stay whole), each distinct (holders, needers, bytes) counted once (a
    reduced piece's shares repeat it)."""
    pieces = _pieces(itemsize, loads, min_piece)
    small = 2 * min_piece

    def split(cell: Cell, nbytes: int) -> list[Cell]:
        if nbytes < small:  # whole (as ``pieces`` says), without the call
            return [cell]
        return _split_in(cell, pieces(cell, nbytes))

    return split


def _pieces(itemsize: int, loads: Loads, min_piece: int) -> Callable[[Cell, int], int]:
    """How many pieces :func:`_splitter` cuts a cell of ``nbytes`` into (1: whole; cells
    under two minimal pieces stay whole), found once per distinct (holders, needers,
    bytes). Reads the loads' hosts and NICs only (:func:`_balance_pieces`)."""
    small = 2 * min_piece
    known: dict[tuple[frozenset[int], frozenset[int], int], int] = {}
    need_nics: dict[frozenset[int], int] = {}

    def pieces(cell: Cell, nbytes: int) -> int:
        if nbytes < small:
            return 1
        key = (cell.holders, cell.needers, nbytes)
        k = known.get(key)
        if k is None:
            k = known[key] = _balance_pieces(cell, nbytes, loads, min_piece, need_nics)
        return k

    return pieces


def _piece_count(itemsize: int, loads: Loads, min_piece: int) -> Callable[[Cell], int]:
    """The number of cells :func:`_splitter` gives for a cell (its non-empty pieces),
    none built."""
    pieces = _pieces(itemsize, loads, min_piece)

    def count(cell: Cell) -> int:
        k = pieces(cell, cell.size * itemsize)
        if k < 2:
            return 1
        box = cell.box
        if not box or not cell.size:  # as split_box cuts them, piece by piece
            return sum(1 for b in split_box(box, k) if box_size(b))
        # pieces of ceil(n / k) along the dim split_box cuts: piece i is empty once
        # i * c >= n (every other dim is not empty)
        lo, hi = box[split_dim(box, k)]
        n = hi - lo
        return min(k, -(-n // chunk_size(n, k)))

    return count


__all__ = [
    "FINE_SPLIT",
    "Cut",
    "LayoutBoxes",
    "Slices",
    "balance_piece",
    "cut_cells",
    "cut_key",
    "cut_slices",
    "least_tasks",
    "same_slices",
]

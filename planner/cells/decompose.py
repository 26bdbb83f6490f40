"""Unit-slice decomposition.

Per tensor dim, the cut points of every source and destination box are merged; every
cell of the resulting grid is a unit slice with one set of source holders and one set
of destination needers. Neighbouring cells with equal holders and needers are then
merged, so a plan has as few transfers as the two layouts allow.

Two builders of the same cells, in the same order: :func:`decompose` one cell at a
time (plain Python, the fastest for the small grids of most tensors), and
:func:`decompose_table` with numpy, column by column, for large grids. The grid of a
large all-to-all has as many cells as devices squared (65,536 at 256 devices per mesh);
there it is built one dim at a time with array operations: per dim the intervals
between merged cut points and, for each, the set of source and destination pieces
covering it (an id); a cell's sets are the intersections of its intervals' sets. Only
the distinct sets (a few hundred) are handled one by one in Python. The result, a
:class:`CellTable`, lists the same cells in the same order as :func:`decompose`; the
planner handles most rows in bulk.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reshard.layout import Box, Layout


@dataclass(frozen=True)
class Cell:
    """A box of the tensor with the devices that hold it and those that need it."""

    box: Box
    holders: frozenset[int]
    needers: frozenset[int]
    size: int = field(init=False, compare=False, repr=False)
    """Elements in the box (derived; computed once, the planner reads it per cell)."""

    def __post_init__(self) -> None:
        n = 1
        for lo, hi in self.box:
            n *= hi - lo
        object.__setattr__(self, "size", n)


def new_cell(box: Box, holders: frozenset[int], needers: frozenset[int]) -> Cell:
    """``Cell(box, holders, needers)`` without the dataclass's ``__init__`` (its
    ``object.__setattr__`` a field and ``__post_init__`` cost more than the rest of
    building a cell, of which a partial source's decomposition builds thousands): the
    same fields, set in the same order, and the same ``size``."""
    n = 1
    for lo, hi in box:
        n *= hi - lo
    cell = _new(Cell)
    cell.__dict__.update(box=box, holders=holders, needers=needers, size=n)
    return cell


_new = object.__new__


def devices_by_box(layout: Layout, shape: tuple[int, ...],
                   only: frozenset[int] | None = None) -> dict[Box, frozenset[int]]:
    """Each distinct box of ``layout`` and the devices holding it (restricted to
    ``only`` when given, e.g. a partial layout's leaders)."""
    out: dict[Box, set[int]] = {}
    for d, b in layout.boxes(shape).items():
        if only is None or d in only:
            out.setdefault(b, set()).add(d)
    return {b: frozenset(s) for b, s in out.items()}


def pieces(boxes: Mapping[Box, frozenset[int]]) -> list[tuple[Box, frozenset[int]]]:
    """The non-empty boxes that some device holds (or needs), with those devices."""
    return [(b, devs) for b, devs in boxes.items() if all(hi > lo for lo, hi in b) and devs]


def decompose(
    shape: tuple[int, ...],
    holders: Mapping[Box, frozenset[int]],
    needers: Mapping[Box, frozenset[int]],
    held_only: bool = False,
) -> list[Cell]:
    """Split a tensor into maximal cells of equal holders and needers.

    Args:
        shape: the global tensor shape.
        holders: each distinct source box and the devices holding its full value.
        needers: each distinct destination box and the devices that must receive it.
        held_only: leave out the cells no one holds too (the cells held are the same:
            :func:`merge_cells` merges only cells of equal holders, so the cells no
            one holds never merge with them, and each prefix of the grid no source
            piece covers is dropped as soon as it is found).

    Returns:
        Cells covering every element some device needs, in a deterministic order
        (row-major over the grid, then merged). Elements no one needs are left out.
    """
    if any(s == 0 for s in shape):
        return []
    src = pieces(holders)
    dst = pieces(needers)
    if not dst:
        return []
    ndim = len(shape)
    if ndim == 0:
        hold = frozenset().union(*(d for _, d in src)) if src else frozenset()
        need = frozenset().union(*(d for _, d in dst))
        return [Cell((), hold, need)] if hold or not held_only else []

    axes = [_intervals(d, shape[d], src, dst) for d in range(ndim)]
    if held_only:  # an interval no source piece covers leaves every cell through it unheld
        axes = [[iv for iv in ax if iv[1]] for ax in axes]
    # The grid's cells dim by dim, dropping a prefix as soon as no one needs it (or,
    # ``held_only``, no one holds it).
    partial: list[tuple[Box, int, int]] = [((), (1 << len(src)) - 1, -1)]
    unheld = not held_only  # whether a prefix no one holds is kept
    for ax in axes:
        partial = [((*box, iv), smask & s, dmask & dm) for box, smask, dmask in partial
                   for iv, s, dm in ax if dmask & dm and (unheld or smask & s)]
    held = _unions({s for _, s, _ in partial}, [devs for _, devs in src])
    needed = _unions({d for _, _, d in partial}, [devs for _, devs in dst])
    cells = [new_cell(box, held[smask], needed[dmask]) for box, smask, dmask in partial]
    return merge_cells(cells, ndim)


def _intervals(d: int, size: int, src: list[tuple[Box, frozenset[int]]],
               dst: list[tuple[Box, frozenset[int]]]) -> list[tuple[tuple[int, int], int, int]]:
    """Dim ``d``'s intervals between the merged cut points of every source and
    destination piece, each with bitmasks of the source / destination pieces covering
    it; intervals no destination piece covers are left out."""
    cuts = {0, size}
    for b, _ in src:
        cuts.update(b[d])
    for b, _ in dst:
        cuts.update(b[d])
    points = sorted(cuts)
    dmasks = _covering(d, points, dst)
    smasks = _covering(d, points, src)
    return [((lo, hi), smasks[i], dmasks[i])
            for i, (lo, hi) in enumerate(itertools.pairwise(points)) if dmasks[i]]


def _covering(d: int, points: list[int], boxes: list[tuple[Box, frozenset[int]]]
              ) -> list[int]:
    """Per interval between consecutive ``points`` (every piece's dim-``d`` bounds among
    them), the bitmask of the pieces whose dim ``d`` covers it. A piece's bounds are
    points, so it covers exactly the intervals from its start's to before its stop's
    (pieces are not empty); pieces spanning every interval are flagged all at once."""
    where = {p: i for i, p in enumerate(points)}
    last = len(points) - 1
    full = 0
    masks = [0] * last
    for i, (b, _) in enumerate(boxes):
        lo, hi = where[b[d][0]], where[b[d][1]]
        if lo == 0 and hi == last:
            full |= 1 << i
            continue
        bit = 1 << i
        for j in range(lo, hi):
            masks[j] |= bit
    return [m | full for m in masks] if full else masks


def _unions(masks: set[int], sets: list[frozenset[int]]) -> dict[int, frozenset[int]]:
    """Per bitmask of ``masks``, the union of the ``sets`` it flags (each distinct
    mask's once)."""
    out: dict[int, frozenset[int]] = {}
    for mask in masks:
        acc: set[int] = set()
        m = mask
        while m:  # each flagged set, lowest bit first (one step a set, not a bit)
            low = m & -m
            acc |= sets[low.bit_length() - 1]
            m ^= low
        out[mask] = frozenset(acc)
    return out


def merge_cells(cells: list[Cell], ndim: int) -> list[Cell]:
    """Merge neighbouring cells with equal holders and needers, last dim first.

    Only cells that share holders and needers with another cell can merge; the rest
    (every cell of an all-to-all) pass through untouched.
    """
    buckets: dict[tuple[Any, ...], list[Cell]] = {}
    for c in cells:
        buckets.setdefault((c.holders, c.needers), []).append(c)
    if len(buckets) == len(cells):
        return sorted(cells, key=lambda c: c.box)
    alone = [b[0] for b in buckets.values() if len(b) == 1]
    cells = [c for b in buckets.values() if len(b) > 1 for c in b]
    for d in reversed(range(ndim)):
        groups: dict[tuple[Any, ...], list[Cell]] = {}
        for c in cells:
            key = (c.holders, c.needers, c.box[:d], c.box[d + 1:])
            groups.setdefault(key, []).append(c)
        merged: list[Cell] = []
        for group in groups.values():
            group.sort(key=lambda c: c.box[d][0])
            cur = group[0]
            for nxt in group[1:]:
                if nxt.box[d][0] == cur.box[d][1]:
                    box = (*cur.box[:d], (cur.box[d][0], nxt.box[d][1]), *cur.box[d + 1:])
                    cur = new_cell(box, cur.holders, cur.needers)
                else:
                    merged.append(cur)
                    cur = nxt
            merged.append(cur)
        cells = merged
    cells += alone
    cells.sort(key=lambda c: c.box)
    return cells


# ----- the same cells with numpy, column by column ------------------------------------

TABLE_FROM = 1024
"""Tensors whose source and destination pieces make at least this many pairs are
decomposed with numpy (:func:`decompose_table`); smaller ones cell by cell (numpy's
fixed cost per call exceeds the work)."""


def boxes_of(lo: np.ndarray, hi: np.ndarray) -> list[Box]:
    """Boxes from their starts and stops ``(rows, ndim)`` as tuples of (start, stop);
    rows share the (start, stop) tuples of equal extents (a grid has few per dim)."""
    if not lo.shape[1]:
        return [()] * len(lo)
    dims = []
    for d in range(lo.shape[1]):
        base = int(hi[:, d].max()) + 1 if len(hi) else 1
        codes, which = np.unique(lo[:, d] * base + hi[:, d], return_inverse=True)
        pairs = [divmod(c, base) for c in codes.tolist()]
        dims.append(map(pairs.__getitem__, which.reshape(-1).tolist()))
    return list(zip(*dims))


@dataclass(frozen=True, eq=False)
class CellTable:
    """Cells of one tensor, column by column: row ``i`` is the cell whose box runs from
    ``lo[i]`` to ``hi[i]`` (per dim), held by ``holder_sets[holder[i]]`` and needed by
    ``needer_sets[needer[i]]``. The planner handles most rows in bulk and builds
    :class:`Cell` objects only for the rest.

    Attributes:
        lo: (cells, ndim) starts.
        hi: (cells, ndim) stops.
        size: (cells,) elements of each box.
        holder: (cells,) index into ``holder_sets``.
        needer: (cells,) index into ``needer_sets``.
        holder_sets: the distinct sets of holders.
        needer_sets: the distinct sets of needers.
    """

    lo: np.ndarray
    hi: np.ndarray
    size: np.ndarray
    holder: np.ndarray
    needer: np.ndarray
    holder_sets: tuple[frozenset[int], ...]
    needer_sets: tuple[frozenset[int], ...]

    def __len__(self) -> int:
        return len(self.size)

    def boxes(self, rows: np.ndarray | None = None) -> list[Box]:
        """The boxes of ``rows`` (default: every row) as tuples of (start, stop); rows
        share the (start, stop) tuples of equal extents (a grid has few per dim)."""
        lo, hi = (self.lo, self.hi) if rows is None else (self.lo[rows], self.hi[rows])
        return boxes_of(lo, hi)

    def cells(self, rows: np.ndarray | None = None) -> list[Cell]:
        """The ``rows`` (default: every row) as :class:`Cell` objects, in row order (as
        :func:`new_cell` builds them, ``size`` read from the column where no product of
        extents can overflow it)."""
        hold, need = self.holder_sets, self.needer_sets
        take: np.ndarray | slice = slice(None) if rows is None else rows
        each = zip(self.boxes(rows), self.holder[take].tolist(), self.needer[take].tolist())
        if not len(self) or math.prod(self.hi.max(axis=0).tolist()) >= 2 ** 63:
            return [new_cell(box, hold[h], need[n]) for box, h, n in each]
        out: list[Cell] = []
        new, append = _new, out.append
        for (box, h, n), size in zip(each, self.size[take].tolist()):
            cell = new(Cell)
            cell.__dict__.update(box=box, holders=hold[h], needers=need[n], size=size)
            append(cell)
        return out

    @classmethod
    def from_cells(cls, cells: list[Cell], ndim: int) -> CellTable:
        """The table of ``cells`` (in their order)."""
        flat = itertools.chain.from_iterable(itertools.chain.from_iterable(
            map(_BOXES, cells)))  # read at once, not as nested sequences
        bounds = np.fromiter(flat, dtype=np.int64, count=2 * ndim * len(cells)
                             ).reshape(len(cells), ndim, 2)
        holder, holder_sets = _numbered(list(map(_HOLDERS, cells)))
        needer, needer_sets = _numbered(list(map(_NEEDERS, cells)))
        lo, hi = bounds[:, :, 0], bounds[:, :, 1]
        size = _volumes(hi - lo) if ndim else np.prod(hi - lo, axis=1)
        return cls(lo, hi, size, holder, needer, holder_sets, needer_sets)


_BOXES = operator.attrgetter("box")
_HOLDERS = operator.attrgetter("holders")
_NEEDERS = operator.attrgetter("needers")


def _numbered(sets: list[frozenset[int]]) -> tuple[np.ndarray, tuple[frozenset[int], ...]]:
    """Each of ``sets`` as the index of its value among the distinct values in order of
    first appearance, and those values (each the first of its equals given)."""
    ids = {s: i for i, s in enumerate(dict.fromkeys(sets))}
    return np.fromiter(map(ids.__getitem__, sets), dtype=np.int64, count=len(sets)), \
        tuple(ids)


def decompose_table(
    shape: tuple[int, ...],
    holders: Mapping[Box, frozenset[int]],
    needers: Mapping[Box, frozenset[int]],
) -> CellTable:
    """:func:`reshard.planner.cells.decompose.decompose` as a :class:`CellTable`: the same
    cells in the same order."""
    table, merge = _table(shape, holders, needers)
    if not merge:
        return table
    return CellTable.from_cells(merge_cells(table.cells(), len(shape)), len(shape))


CELLS_FROM = 16384
"""Source and destination pieces' pairs from which :func:`decompose_cells` builds the
grid with numpy (the 1,024-device grids of a partial source's reduced pieces)."""


def decompose_cells(
    shape: tuple[int, ...],
    holders: Mapping[Box, frozenset[int]],
    needers: Mapping[Box, frozenset[int]],
) -> list[Cell]:
    """:func:`decompose`'s cells, from :func:`decompose_table`'s arrays where the pieces
    make :data:`CELLS_FROM` pairs or more (the same cells in the same order, the grid
    built column by column instead of cell by cell)."""
    if len(holders) * len(needers) < CELLS_FROM:
        return decompose(shape, holders, needers)
    table, merge = _table(shape, holders, needers)
    cells = table.cells()
    return merge_cells(cells, len(shape)) if merge else cells


def decompose_rows(
    shape: tuple[int, ...],
    holders: Mapping[Box, frozenset[int]],
    needers: Mapping[Box, frozenset[int]],
) -> list[Cell] | CellTable:
    """:func:`decompose_cells`' cells, as their :class:`CellTable` where it builds them
    from the table and none merge (the same rows in the same order)."""
    if len(holders) * len(needers) < CELLS_FROM:
        return decompose(shape, holders, needers)
    table, merge = _table(shape, holders, needers)
    return merge_cells(table.cells(), len(shape)) if merge else table


def _table(shape: tuple[int, ...], holders: Mapping[Box, frozenset[int]],
           needers: Mapping[Box, frozenset[int]]) -> tuple[CellTable, bool]:
    """:func:`decompose_table`'s grid before merging, and whether some of its cells
    share holders and needers (then :func:`merge_cells` may merge them)."""
    ndim = len(shape)
    empty = CellTable(np.zeros((0, ndim), np.int64), np.zeros((0, ndim), np.int64),
                      np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                      (), ())
    if any(s == 0 for s in shape):
        return empty, False
    src = pieces(holders)
    dst = pieces(needers)
    if not dst:
        return empty, False
    if ndim == 0:
        hold = frozenset().union(*(d for _, d in src)) if src else frozenset()
        need = frozenset().union(*(d for _, d in dst))
        return CellTable.from_cells([Cell((), hold, need)], 0), False

    src_sets = _PieceSets([devs for _, devs in src])
    dst_sets = _PieceSets([devs for _, devs in dst])
    cell_lo, cell_hi, cell_src, cell_dst = _grid(shape, src, dst, src_sets, dst_sets)
    # Sets of pieces -> sets of devices (pieces of one device set share an id).
    hold_of = np.array(src_sets.device_set, dtype=np.int64)[cell_src]
    need_of = np.array(dst_sets.device_set, dtype=np.int64)[cell_dst]
    table = CellTable(cell_lo, cell_hi, _volumes_between(cell_lo, cell_hi), hold_of,
                      need_of, src_sets.distinct_devices(), dst_sets.distinct_devices())
    # nothing to merge: row-major = box order
    pair = hold_of * (len(table.needer_sets) + 1)
    pair += need_of  # in place: one array of every row, not two
    return table, _repeats(pair, len(table.holder_sets) * (len(table.needer_sets) + 1))


def _volumes(extents: np.ndarray) -> np.ndarray:
    """``np.prod(extents, axis=1)`` (integers: the same products), column by column
    (numpy's reduction along a short axis costs far more a row)."""
    out = extents[:, 0].copy()
    for j in range(1, extents.shape[1]):
        out *= extents[:, j]
    return out


def _volumes_between(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """:func:`_volumes` of ``hi - lo``, a column's extents at a time (the same products
    in the same order, without every row's extents laid out at once)."""
    out: np.ndarray = hi[:, 0] - lo[:, 0]
    for j in range(1, lo.shape[1]):
        out *= hi[:, j] - lo[:, j]
    return out


def _repeats(codes: np.ndarray, span: int) -> bool:
    """Whether some value of ``codes`` (non-negative, below ``span``) comes twice: by
    counting where ``span`` is within a few times the codes, else by sorting."""
    if len(codes) < 2:
        return False
    if span <= 4 * len(codes) + 1024:
        return bool(np.bincount(codes, minlength=span).max() > 1)
    pairs = np.sort(codes)
    return not bool((pairs[1:] != pairs[:-1]).all())


def _grid(shape: tuple[int, ...], src: list[tuple[Box, frozenset[int]]],
          dst: list[tuple[Box, frozenset[int]]], src_sets: _PieceSets, dst_sets: _PieceSets
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The grid's needed cells dim by dim (row-major), dropping a prefix as soon as no
    one needs it: their low and high corners, and the ids of the source and destination
    pieces covering each. Per dim, the intervals between merged cut points, and for each
    the id of the set of pieces covering it."""
    ndim = len(shape)
    src_lo, src_hi = _bounds([b for b, _ in src], ndim)
    dst_lo, dst_hi = _bounds([b for b, _ in dst], ndim)
    cell_lo = np.zeros((1, 0), dtype=np.int64)
    cell_hi = np.zeros((1, 0), dtype=np.int64)
    cell_src = np.full(1, src_sets.everything, dtype=np.int64)
    cell_dst = np.full(1, dst_sets.everything, dtype=np.int64)
    for d in range(ndim):
        pts = np.unique(np.concatenate(([0, shape[d]], src_lo[:, d], src_hi[:, d],
                                        dst_lo[:, d], dst_hi[:, d])))
        lo, hi = pts[:-1], pts[1:]
        iv_dst = dst_sets.covering(lo, hi, dst_lo[:, d], dst_hi[:, d])
        keep = iv_dst != dst_sets.nothing
        lo, hi, iv_dst = lo[keep], hi[keep], iv_dst[keep]
        iv_src = src_sets.covering(lo, hi, src_lo[:, d], src_hi[:, d])
        new_dst = dst_sets.intersect_outer(cell_dst, iv_dst)
        needed = new_dst != dst_sets.nothing
        every = bool(needed.all())
        new_src = src_sets.intersect_outer(cell_src, iv_src, None if every else needed)
        at = None if every else np.flatnonzero(needed)
        cell_lo, cell_hi = _extended(cell_lo, lo, at), _extended(cell_hi, hi, at)
        cell_src, cell_dst = new_src, new_dst if every else new_dst[needed]
    return cell_lo, cell_hi, cell_src, cell_dst


def _extended(corners: np.ndarray, bounds: np.ndarray, at: np.ndarray | None) -> np.ndarray:
    """Each row of ``corners`` (cells of the dims so far) followed by each of ``bounds``
    (one dim's intervals), row-major, the rows ``at`` (flat indices, ascending) or all:
    the rows of ``np.repeat(corners, k, axis=0)`` beside ``np.tile(bounds, n)``,
    written in place rather than gathered."""
    n, k = len(corners), len(bounds)
    dtype = np.result_type(corners, bounds)
    if at is None:
        out = np.empty((n * k, corners.shape[1] + 1), dtype=dtype)
        grid = out.reshape(n, k, corners.shape[1] + 1)
        grid[:, :, :-1] = corners[:, None, :]
        grid[:, :, -1] = bounds[None, :]
        return out
    out = np.empty((len(at), corners.shape[1] + 1), dtype=dtype)
    out[:, :-1] = np.take(corners, at // k, axis=0)
    out[:, -1] = np.take(bounds, at % k)
    return out


def _members(which: np.ndarray, n: int) -> list[frozenset[int]]:
    """Per value ``e`` below ``n``, the positions ``i`` where ``which[i] == e`` (each
    extent's pieces)."""
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(n + 1)).tolist()
    at = order.tolist()
    return [frozenset(at[a:b]) for a, b in itertools.pairwise(bounds)]


def _bounds(boxes: list[Box], ndim: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts and stops of ``boxes`` as two (boxes, ndim) integer arrays."""
    arr = np.array(boxes, dtype=np.int64).reshape(len(boxes), ndim, 2)
    return arr[:, :, 0], arr[:, :, 1]


class _PieceSets:
    """Sets of pieces (frozensets of piece indices), each with an id, and the devices
    holding them. Id ``everything`` is every piece, ``nothing`` none.

    Only distinct sets are handled in Python: cells refer to them by id (arrays). A
    set is kept as its members, so memory is the sum of the distinct sets' sizes: about
    one entry per piece and dim for grid layouts (a dim's chunks partition it), never
    pieces x intervals.
    """

    def __init__(self, piece_devices: list[frozenset[int]]) -> None:
        self.piece_devices = piece_devices
        self.sets: list[frozenset[int]] = []  # per id: its pieces
        self.device_set: list[int] = []  # per id: index of its devices in distinct_devices
        self._by_set: dict[frozenset[int], int] = {}
        self._by_devices: dict[frozenset[int], int] = {}
        self.nothing = self._id(frozenset())
        self.everything = self._id(frozenset(range(len(piece_devices))))

    def _id(self, members: frozenset[int]) -> int:
        got = self._by_set.get(members)
        if got is None:
            devs = frozenset().union(*map(self.piece_devices.__getitem__, members))
            got = len(self.sets)
            self.sets.append(members)
            self.device_set.append(self._by_devices.setdefault(devs, len(self._by_devices)))
            self._by_set[members] = got
        return got

    def distinct_devices(self) -> tuple[frozenset[int], ...]:
        """The distinct device sets, indexed as :attr:`device_set` says."""
        return tuple(self._by_devices)

    def covering(self, lo: np.ndarray, hi: np.ndarray, piece_lo: np.ndarray,
                 piece_hi: np.ndarray) -> np.ndarray:
        """Per interval ``[lo[i], hi[i])`` of one dim (sorted, disjoint): the id of the
        set of pieces whose extent in that dim (``piece_lo``, ``piece_hi``) contains it.

        A piece covers a run of consecutive intervals; the covering set changes only
        where a run starts or ends, so the intervals are swept once, run by run
        (pieces of one extent join and leave together)."""
        ids = np.full(len(lo), self.nothing, dtype=np.int64)
        if not len(lo):
            return ids
        extents, which = np.unique(np.stack([piece_lo, piece_hi], axis=1), axis=0,
                                   return_inverse=True)
        first = np.searchsorted(lo, extents[:, 0], side="left")
        stop = np.searchsorted(hi, extents[:, 1], side="right")
        runs = first < stop  # extents covering at least one interval
        members = _members(which.reshape(-1), len(extents))
        starts: dict[int, list[int]] = {}
        ends: dict[int, list[int]] = {}
        for e in np.flatnonzero(runs).tolist():
            starts.setdefault(int(first[e]), []).append(e)
            ends.setdefault(int(stop[e]), []).append(e)
        active: set[int] = set()
        edges = sorted(set(starts) | set(ends))
        for at, until in zip(edges, [*edges[1:], len(lo)]):
            active.difference_update(ends.get(at, ()))
            active.update(starts.get(at, ()))
            if active and at < until:
                ids[at:until] = self._id(frozenset().union(*map(members.__getitem__, active)))
        return ids

    def intersect_outer(self, a: np.ndarray, b: np.ndarray, keep: np.ndarray | None = None
                        ) -> np.ndarray:
        """:meth:`intersect` of ``np.repeat(a, len(b))`` and ``np.tile(b, len(a))`` (every
        pair, row-major), where ``keep`` (a mask of those pairs) says: the same ids,
        found in the same order (ascending pairs of sets), by the pairs of distinct
        sets (ranks of ``a``'s and ``b``'s values) instead of sorting every pair."""
        if not len(a) or not len(b):
            return np.zeros(0, dtype=np.int64)
        ua, ia = np.unique(a, return_inverse=True)
        ub, ib = np.unique(b, return_inverse=True)
        nb = len(ub)
        if keep is None:  # every pair of ranks is some pair's: each set found in turn
            sets, pairs = self.sets, itertools.product(ua.tolist(), ub.tolist())
            by_rank = np.array([self._id(sets[x] & sets[y]) for x, y in pairs],
                               dtype=np.int64).reshape(len(ua), nb)
            got_all: np.ndarray = np.take(by_rank[ia], ib, axis=1).reshape(-1)
            return got_all
        pair = (ia.reshape(-1, 1) * nb + ib.reshape(1, -1)).reshape(-1)[keep]
        if not len(pair):
            return np.zeros(0, dtype=np.int64)
        seen = np.zeros(len(ua) * nb, dtype=bool)
        seen[pair] = True
        found = np.flatnonzero(seen)
        sets, first, second = self.sets, ua[found // nb].tolist(), ub[found % nb].tolist()
        ids = np.zeros(len(seen), dtype=np.int64)
        ids[found] = [self._id(sets[x] & sets[y]) for x, y in zip(first, second)]
        got: np.ndarray = ids[pair]
        return got

    def intersect(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Element-wise ids of the intersections of sets ``a[i]`` and ``b[i]``."""
        if not len(a):
            return a
        base = len(self.sets) + 1
        code = a * base + b
        uniq, inverse = np.unique(code, return_inverse=True)
        sets = self.sets
        ids = np.array([self._id(sets[c // base] & sets[c % base]) for c in uniq.tolist()],
                       dtype=np.int64)
        return ids[inverse.reshape(-1)]

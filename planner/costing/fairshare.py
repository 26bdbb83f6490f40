"""Max-min fair rates of transfers sharing resources, by progressive filling.

Every flowing transfer (a task of the cost model) crosses some resources, each carrying
a fraction of its bytes; a resource has a capacity in bytes per second. Max-min fair
rates are what progressive filling gives: every unfrozen transfer's rate rises at the
same pace until some resource is full; the transfers crossing it freeze at that rate,
and the rest go on rising.

Two things keep this fast on plans of tens of thousands of concurrent transfers (a
DeepSeek-V3 weight sync on GB200: 32,435 tasks in one step):

* each round of the filling touches only the resources that fill and the transfers
  that freeze (sparse: a transfer's edges, and a filling's edges sorted by resource,
  are contiguous ranges), not every edge; a resource fills at most once, so a whole
  filling is linear in the edges of the transfers it fills (plus their sort by
  resource) and a few array operations per round;
* :meth:`FairShare.fill` takes the last filling: when transfers only ended since,
  every transfer that froze below the lowest rate of the ended ones keeps its rate (a
  resource that filled below that level carried none of them, so the filling up to it
  is unchanged), and only the rest are filled again;
* an end that takes no load off a full resource changes no rate at all (every other
  transfer's bottleneck is still full, and it still has the highest rate there), so
  the caller need not fill again (:attr:`Fill.level` says which resources are full).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.costing.first_seen import numbered
from reshard.planner.costing.index_sets import EdgesOn as _EdgesOn
from reshard.planner.costing.index_sets import distinct, ranges, sorted_distinct
from reshard.planner.costing.index_sets import flagged_distinct as _distinct
from reshard.planner.costing.path_join import fractions, joined
from reshard.planner.values.resources import KIND_CODE, KINDS, Resource, capacity, of_code

TIGHT = 1e-9
"""Resources whose level is within this relative margin of the lowest fill together
(one round)."""

LARGE = 1 << 15
"""Set-ups of at least this many edges read each path's fractions on their own
(:meth:`FairShare.__init__`), and find the edges of many transfers in one pass
(:meth:`FairShare.edges_of`); fewer, the array operations' cost per call outweighs
the passes they save."""

BLOCK = 1 << 18
"""Edges whose values :meth:`FairShare.edge_sums` lays out at a time (2 MiB: the
transfers whose edges fit, or one transfer)."""

SMALL = 64
"""Fillings of at most this many edges run on Python floats (a handful of resources
and transfers: numpy's cost per call outweighs its arrays)."""


def _ones(n: int) -> np.ndarray:
    """``n`` fractions of 1.0, read only: one value seen ``n`` times (never written:
    every reader of a set-up's fractions gathers or multiplies them)."""
    out: np.ndarray = np.broadcast_to(np.ones(1), (n,))
    return out


class Path(list[tuple[Resource, float]]):
    """A route's resources and fractions (a list, as any path), which keeps its
    resources' codes and fractions as arrays once :func:`path_arrays` read them: the
    candidates of one planning call share their tasks' routes, so each is read once.
    ``codes``: its resources' codes where its maker knew them and every fraction is 1
    (a transfer's hops). A path made from its arrays (:meth:`of_codes`) builds its
    list only when something reads it as one (the cost model reads the arrays).
    ``whole``: every fraction is known to be 1.0 (its maker's codes; ones that
    :meth:`of_codes` made, or was given read only), so that a set-up need not read
    them (shared ones that could be written to are read)."""

    __slots__ = ("_unread", "arrays", "codes", "whole")

    def __init__(self, edges: Sequence[tuple[Resource, float]] = (),
                 codes: Sequence[int] | None = None) -> None:
        super().__init__(edges)
        self.arrays: tuple[np.ndarray, np.ndarray] | None = None
        self.codes = codes
        self.whole = codes is not None
        self._unread = False

    @classmethod
    def of_codes(cls, codes: np.ndarray, ones: np.ndarray | None = None) -> Path:
        """The path crossing the resources numbered ``codes`` (:func:`~reshard.planner.
        values.resources.code`), every byte each, its list built when first read
        (``ones``: its fractions, ``len(codes)`` ones read only, shared by paths of as
        many codes; made where not given)."""
        out = cls.__new__(cls)  # an empty list: __init__'s work, without its call
        out.arrays = (codes, np.ones(len(codes)) if ones is None else ones)
        out.codes = None
        out.whole = ones is None or not ones.flags.writeable  # ones no one may change
        out._unread = True
        return out

    def _read(self) -> None:
        """Build the list from the arrays (once)."""
        if self._unread:
            self._unread = False
            codes, frac = self.arrays  # type: ignore[misc]
            list.extend(self, [(of_code(c), f) for c, f in zip(codes.tolist(), frac.tolist())])

    def __len__(self) -> int:
        return len(self.arrays[0]) if self._unread else list.__len__(self)  # type: ignore[index]

    def __iter__(self):  # type: ignore[no-untyped-def]
        self._read()
        return list.__iter__(self)

    def __reversed__(self):  # type: ignore[no-untyped-def]
        self._read()
        return list.__reversed__(self)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        self._read()
        return list.__getitem__(self, i)

    def __contains__(self, item: object) -> bool:
        self._read()
        return list.__contains__(self, item)

    def __eq__(self, other: object) -> bool:
        self._read()
        if isinstance(other, Path):
            other._read()
        return list.__eq__(self, other)

    __hash__ = None

    def __repr__(self) -> str:
        self._read()
        return list.__repr__(self)

    def copy(self) -> list[tuple[Resource, float]]:
        self._read()
        return list.copy(self)


def path_arrays(path: Sequence[tuple[Resource, float]]) -> tuple[np.ndarray, np.ndarray]:
    """The resources of ``path`` as codes (:func:`~reshard.planner.values.resources.
    code`) and their fractions (kept on a :class:`Path`)."""
    got = path.arrays if isinstance(path, Path) else None
    if got is None and isinstance(path, Path) and path.codes is not None:
        got = path.arrays = (np.array(path.codes, dtype=np.int64), np.ones(len(path)))
    if got is None:
        n = len(path)
        got = (np.fromiter((i * 8 + KIND_CODE[k] for (k, i), _ in path), dtype=np.int64, count=n),
               np.fromiter((f for _, f in path), dtype=np.float64, count=n))
        if isinstance(path, Path):
            path.arrays = got
    return got


def _alone(paths: list[Sequence[tuple[Resource, float]]]) -> list[Sequence[int] | None]:
    """Per path its codes where it is known by them alone (a :class:`Path` whose maker
    knew them, every fraction 1.0, whose arrays no one built yet: :func:`path_arrays`
    would build ``codes`` and ones), else None."""
    return [p.codes if isinstance(p, Path) and p.arrays is None else None for p in paths]


def _coded(paths: list[Sequence[tuple[Resource, float]]]
           ) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Per path its arrays (:func:`path_arrays`), its fractions None where every one is
    known to be 1.0 (:attr:`Path.whole`): no array of ones joined and read."""
    wholes = map(getattr, paths, itertools.repeat("whole"), itertools.repeat(False))
    return [(a[0], None) if w else a for a, w in zip(map(path_arrays, paths), wholes)]


class FairShare:
    """Transfers x resources, and their max-min fair rates.

    Args:
        paths: per transfer, the resources it crosses and the fraction of its bytes on
            each (a fraction of 0 is no use of the resource).
        cluster: the capacities.
    """

    task: np.ndarray  # each edge's transfer (set up, or made when first read)

    def __init__(self, paths: Sequence[Sequence[tuple[Resource, float]]],
                 cluster: Cluster) -> None:
        # tasks of one route share one path object: each distinct path is read once
        # (ids and their first places found by dicts over maps: no Python loop)
        ids = list(map(id, paths))
        distinct = dict(zip(ids, paths))
        # hops known by their codes alone join as Python lists (path_join), the rest
        # as their arrays; every fraction of the first is 1.0, known unread
        codes, pieces, dlens = joined(list(distinct.values()), _alone, _coded)
        # many edges: each fraction array read once rather than all joined and read
        frac = fractions(pieces, LARGE)
        whole = frac is None
        dfrac = _ones(len(codes)) if frac is None else frac
        if len(distinct) == len(paths):  # every path its own: the edges as they are
            self._edges(codes, dfrac, dlens, cluster, whole, reuse=True)
            return
        number = dict(zip(distinct, range(len(distinct))))  # first places, in order
        of = np.fromiter(map(number.__getitem__, ids), dtype=np.int64, count=len(ids))
        dat = np.concatenate([[0], np.cumsum(dlens)])
        lens = dlens[of]
        edges = ranges(dat[of], dat[of] + lens)
        self._edges(codes[edges], _ones(len(edges)) if whole else dfrac[edges], lens,
                    cluster, whole, reuse=True)

    @classmethod
    def of_edges(cls, codes: np.ndarray, frac: np.ndarray | None, lens: np.ndarray,
                 cluster: Cluster) -> FairShare:
        """The transfers whose paths are given as arrays: transfer ``t`` crosses the
        resources of the next ``lens[t]`` ``codes`` (:func:`~reshard.planner.values.
        resources.code`), each with its ``frac``: the same as the paths as lists.
        ``frac`` None: every fraction is 1.0 (read only ones, none laid out)."""
        out = cls.__new__(cls)
        if frac is None:
            out._edges(codes, _ones(len(codes)), lens, cluster, True)
        else:
            out._edges(codes, frac, lens, cluster)
        return out

    def _edges(self, codes: np.ndarray, frac: np.ndarray, lens: np.ndarray,
               cluster: Cluster, whole: bool = False, reuse: bool = False) -> None:
        """Set up from every transfer's edges (:meth:`of_edges`; ``whole``: every
        fraction is known to be 1.0; ``reuse``: ``codes`` is the set-up's own, joined
        for it, so its numbers may be written over it: :func:`~reshard.planner.costing.
        first_seen.numbered`)."""
        in_order, res = numbered(codes, reuse)  # resources in the order they first appear
        self.n = len(lens)
        self.codes, self.nres = in_order, len(in_order)  # each resource's code
        self._resources: list[Resource] | None = None
        kind = in_order % 8  # each resource's kind's place in KINDS
        present = set(kind.tolist())
        self.capacity = np.array([capacity((k, 0), cluster) if i in present else 0.0
                                  for i, k in enumerate(KINDS)], dtype=np.float64)[kind]
        # every edge carries its transfer's whole bytes (loads: 1.0 * x is x); then
        # every edge is used, and the largest fraction is 1.0 (no pass for either)
        self.whole = whole or bool((frac == 1.0).all())
        used = None if self.whole else frac > 0
        if used is None or used.all():  # every edge kept: a transfer's edges are its lens
            if res.size < LARGE:  # else made when first read (__getattr__)
                self.task = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
            self.res, self.frac = res, frac
            self.task_at = np.concatenate(([0], np.cumsum(lens, dtype=np.int64)))
            self.limited = lens > 0
            self.counts = lens  # each transfer's edges
        else:
            self.task = np.repeat(np.arange(len(lens), dtype=np.int64), lens)[used]
            self.res = res[used]
            self.frac = frac[used]
            # a transfer's edges: task_at[t]:task_at[t + 1]
            self.task_at = np.searchsorted(self.task, np.arange(self.n + 1))
            self.limited = np.bincount(self.task, minlength=self.n) > 0
            self.counts = np.diff(self.task_at)
            self.whole = bool((self.frac == 1.0).all())  # of the edges kept
        # demand below this is rounding (a resource whose transfers all froze)
        self.floor = 1e-12 * (1.0 if self.whole else float(self.frac.max(initial=1.0)))

    def __getattr__(self, name: str) -> np.ndarray:
        """:attr:`task` (each edge's transfer, edges in transfer order: each transfer's
        number repeated by its count of edges) where a large set-up left it out, made
        when first read (a run that reads every edge at once, as most large ones do,
        never reads it); then an attribute like any other."""
        if name != "task":
            raise AttributeError(name)
        self.task = np.repeat(np.arange(self.n, dtype=np.int64), self.counts)
        return self.task

    @property
    def resources(self) -> list[Resource]:
        """The resources, in the order they first appear on an edge (built when first
        read: the simulation reads their :attr:`codes`, and one name)."""
        if self._resources is None:
            self._resources = [of_code(c) for c in self.codes.tolist()]
        return self._resources

    def resource(self, i: int) -> Resource:
        """``resources[i]``, without building the others."""
        return of_code(int(self.codes[i]))

    def per_edge(self, values: np.ndarray) -> np.ndarray:
        """``values[self.task]`` (a value per transfer, on each of its edges) as one
        ``np.repeat`` by its count of edges: ``task`` is each transfer's number
        repeated so (edges in transfer order), so the same array, without reading
        ``task``."""
        out: np.ndarray = values.repeat(self.counts)
        return out

    def _every(self, which: np.ndarray) -> bool:
        """Whether the transfers ``which`` are every transfer, in order (their edges
        are then every edge, in order: ``ranges`` of them is ``arange``): :func:`~reshard.
        planner.costing.index_sets.is_arange`, written out (read on every fill)."""
        n = self.n
        return len(which) == n and (not n or bool(which[0] == 0 and which[-1] == n - 1 and
                                                  (which[1:] > which[:-1]).all()))

    def _many(self, which: np.ndarray, share: int) -> bool:
        """Whether the transfers ``which`` are increasing (then their edges, transfer by
        transfer, are in edge order) and have at least ``1 / share`` of every edge, of
        :data:`LARGE` or more: then one pass over every edge costs less than
        gathering theirs."""
        if len(which) < 2 or len(self.res) < LARGE or \
                int(self.counts[which].sum()) * share < len(self.res):
            return False
        return bool((which[1:] > which[:-1]).all())

    def edges_of(self, which: np.ndarray) -> np.ndarray:
        """The edges of the transfers ``which``, transfer by transfer (:func:`ranges` of
        their edges); where :meth:`_many` (a quarter of the edges, or more), the edges
        whose transfer is flagged: the same array, increasing, from one pass over the
        edges (:func:`ranges` makes three of its length)."""
        if self._many(which, 4):
            flag = np.zeros(self.n, dtype=bool)
            flag[which] = True
            edges: np.ndarray = np.flatnonzero(self.per_edge(flag))
            return edges
        return ranges(self.task_at[which], self.task_at[which + 1])

    def _all_edges(self, mine: np.ndarray | None) -> bool:
        """Whether ``mine``, the edges of distinct transfers in order (:meth:`fill`'s),
        is every edge (then in order: ``arange``; None: every edge, not laid out)."""
        return mine is None or len(mine) == len(self.res)

    def _all_frozen(self, active: np.ndarray) -> bool:
        """Whether no transfer still ``active`` in a filling crosses a resource: no later
        round can freeze one (each freezes only transfers on a resource), so what is
        left (capacities, demands, levels) is read no more."""
        return not (active & self.limited).any()

    def load(self, which: np.ndarray, rate: np.ndarray) -> np.ndarray:
        """Bytes/s that the transfers ``which`` (indices) at ``rate`` put on each
        resource."""
        return self.loads(which, rate)[0]

    def loads(self, which: np.ndarray, *rates: np.ndarray) -> list[np.ndarray]:
        """:meth:`load` of ``which`` at each of ``rates`` (their edges found once)."""
        every = self._every(which)
        # many edges of increasing transfers: every edge, the others' at rate 0.0 (each
        # resource's sum from 0.0 adds theirs in the same order, and s + 0.0 is s)
        spread = not every and self._many(which, 2)
        out = []
        if every or spread:  # every edge, in order: the arrays themselves (edge_sums)
            for rate in rates:
                # a transfer's finite rate (else 0) on each of its edges: the same as the
                # rate on each edge, finite or 0, with one pass over the transfers
                finite = np.where(np.isfinite(rate), rate, 0.0)
                if spread:
                    only = np.zeros(self.n)
                    only[which] = finite[which]
                    finite = only
                out.append(self.edge_sums(finite))
            return out
        mine = ranges(self.task_at[which], self.task_at[which + 1])
        task, res = self.task[mine], self.res[mine]
        frac = self.frac if self.whole else self.frac[mine]  # read only if not whole
        for rate in rates:
            r = np.where(np.isfinite(rate), rate, 0.0)[task]
            out.append(np.bincount(res, weights=r if self.whole else frac * r,
                                   minlength=self.nres))
        return out

    def edge_sums(self, values: np.ndarray) -> np.ndarray:
        """Per resource the sum of ``values[t] * frac`` over its edges, in edge order
        from 0.0: ``np.bincount(res, weights=per_edge(values) * frac)`` (no product
        where :attr:`whole`). Of :data:`LARGE` edges or more, the same sums by
        ``np.add.at`` a block of edges at a time (each edge's value added to its
        resource's sum in edge order, as ``bincount`` adds: the same bits), without the
        values of every edge at once (a fresh array of 32 MiB at a million tasks)."""
        res, frac, nres = self.res, self.frac, self.nres
        if res.size < LARGE:
            on = self.per_edge(values)
            return np.bincount(res, weights=on if self.whole else frac * on, minlength=nres)
        out = np.zeros(nres)
        at, t = self.task_at, 0
        while t < self.n:  # transfers t:u, of BLOCK edges or fewer (one transfer, more)
            u = min(self.n, max(t + 1, int(np.searchsorted(at, at[t] + BLOCK, "right")) - 1))
            a, b = int(at[t]), int(at[u])
            on = values[t:u].repeat(self.counts[t:u])
            if not self.whole:
                on *= frac[a:b]
            np.add.at(out, res[a:b], on)
            t = u
        return out

    def fill(self, flowing: np.ndarray, last: Fill | None = None,
             below: float = np.inf, usage: np.ndarray | None = None) -> Fill:
        """Max-min fair rates (bytes/s) of the transfers flagged in ``flowing`` (inf for
        one that crosses no resource, 0 for one not flowing), and the level each
        resource filled at.

        Args:
            flowing: which transfers flow.
            last: the fill of an earlier set of transfers, of which the present one
                lacks only transfers that froze at ``below`` or above (see the module
                docstring): what froze below ``below`` is kept, the rest filled again.
            below: that level (inf with no ``last``: everything is filled).
            usage: with ``last``, the load (bytes/s per resource) the flowing
                transfers put on the resources at their ``last`` rates: then only the
                edges of the transfers filled again are read.
        """
        rate = np.zeros(self.n)
        filled = np.full(self.nres, np.inf)
        active = flowing.copy()
        left = self.capacity.copy()
        mine: np.ndarray | None  # None: every edge
        if last is not None and usage is not None and np.isfinite(below):
            cut = below * (1 - TIGHT)
            kept = flowing & (last.rate < cut)
            active &= ~kept
            rate[kept] = last.rate[kept]
            held = last.level < cut
            filled[held] = last.level[held]
            # what the kept transfers use: everything, less what the others used
            again = active.nonzero()[0]
            mine = edges = self.edges_of(again)
            if not len(edges):  # nothing to fill again (the capacity left is of no use)
                rate[again] = np.inf
                return Fill(rate, filled)
            prev = last.rate[self.task[edges]]
            left -= usage - np.bincount(self.res[edges], weights=self.frac[edges] * np.where(
                np.isfinite(prev), prev, 0.0), minlength=self.nres)
            np.maximum(left, 0.0, out=left)
        else:
            again = active.nonzero()[0]
            mine = None if self._every(again) else self.edges_of(again)
        rate[again[~self.limited[again]]] = np.inf
        count = self.res.size if mine is None else mine.size
        if count > SMALL:
            self._progressive(mine, active, left, rate, filled)
        elif count:
            self._progressive_small(np.arange(count) if mine is None else mine, left, rate,
                                    filled)
        return Fill(rate, filled)

    def _progressive_small(self, mine: np.ndarray, left: np.ndarray, rate: np.ndarray,
                           filled: np.ndarray) -> None:
        """:meth:`_progressive` of a few edges (at most :data:`SMALL`), on Python floats:
        the same operations in the same order (every sum per resource added up in edge
        order from 0, as ``np.bincount`` does, then taken off), so the same bits."""
        nres, inf = self.nres, np.inf
        tasks, res, frac = (self.task[mine].tolist(), self.res[mine].tolist(),
                            self.frac[mine].tolist())
        room, demand = left.tolist(), [0.0] * nres
        by_res: list[list[int]] = [[] for _ in range(nres)]
        own: dict[int, list[tuple[int, float]]] = {}  # a transfer's edges, in order
        for t, r, f in zip(tasks, res, frac):
            demand[r] += f
            by_res[r].append(t)
            own.setdefault(t, []).append((r, f))
        level = [room[r] / d if d > 0 else inf for r, d in enumerate(demand)]
        done: dict[int, float] = {}
        full: dict[int, float] = {}
        while True:
            low = min(level)
            if low == inf:
                break
            cut = low * (1 + TIGHT)
            tight = [r for r in range(nres) if level[r] <= cut]
            frozen = sorted({t for r in tight for t in by_res[r]} - done.keys())
            for r in tight:
                level[r], demand[r] = inf, 0.0
            if not frozen:
                continue
            full.update(dict.fromkeys(tight, low))
            done.update(dict.fromkeys(frozen, low))
            taken: dict[int, float] = {}
            less: dict[int, float] = {}
            for t in frozen:
                for r, f in own[t]:
                    taken[r] = taken.get(r, 0.0) + f * low
                    less[r] = less.get(r, 0.0) + f
            for r in sorted(taken):
                room[r] -= taken[r]
                demand[r] -= less[r]
                if level[r] != inf:
                    d = demand[r]
                    level[r] = max(room[r], 0.0) / d if d > self.floor else inf
        if done:
            rate[list(done)] = list(done.values())
            filled[list(full)] = list(full.values())

    def _crossing(self, mine: np.ndarray | None) -> np.ndarray:
        """The transfers of the edges ``mine`` (distinct, increasing): where ``mine`` is
        every edge, every transfer with an edge (:attr:`limited`), without reading
        them."""
        if self._all_edges(mine):
            every: np.ndarray = self.limited.nonzero()[0]
            return every
        return _distinct(self.task[mine], self.n)

    def _progressive(self, mine: np.ndarray | None, active: np.ndarray, left: np.ndarray,
                     rate: np.ndarray, filled: np.ndarray) -> None:
        """Progressive filling of the ``active`` transfers (their edges ``mine``) on
        the capacity ``left`` (``mine`` None: every edge): sets their ``rate`` and the
        ``filled`` level of each resource that fills, a round per lowest level (module
        docstring)."""
        nres = self.nres
        r, f = (self.res, self.frac) if mine is None or self._all_edges(mine) else \
            (self.res[mine], self.frac[mine])
        demand = self._demand(r, f) if r.size >= LARGE else \
            np.bincount(r, weights=f, minlength=nres)
        on = _EdgesOn(mine, r, nres)
        level = np.full(nres, np.inf)
        some = demand > 0  # the resources the filling's edges cross (each fraction > 0)
        level[some] = left[some] / demand[some]
        crossed = int(np.count_nonzero(some))
        first = True
        while nres:
            low = float(level.min())
            if not np.isfinite(low):
                break
            tight = (level <= low * (1 + TIGHT)).nonzero()[0]
            if first and len(tight) == crossed:  # all fill at once: every edge is on one
                frozen = self._crossing(mine)
            elif first and self.res.size >= LARGE and (mine is None or self._all_edges(mine)):
                frozen = self._first_frozen(tight)
            else:
                frozen = _distinct(self.task[on.swept(tight) if first else on.sorted(tight)],
                                   self.n)
            first = False
            frozen = frozen[active[frozen]]
            level[tight] = np.inf
            demand[tight] = 0.0
            if not len(frozen):
                continue
            filled[tight] = low
            rate[frozen] = low
            active[frozen] = False
            if self._all_frozen(active):  # no later round freezes anything: done
                break
            edges = self.edges_of(frozen)
            r, f = self.res[edges], self.frac[edges]
            left -= np.bincount(r, weights=f * low, minlength=nres)
            demand -= np.bincount(r, weights=f, minlength=nres)
            touched = _distinct(r, nres)
            touched = touched[np.isfinite(level[touched])]
            d = demand[touched]
            live = d > self.floor
            level[touched] = np.inf
            level[touched[live]] = np.maximum(left[touched[live]], 0.0) / d[live]


    def _first_frozen(self, tight: np.ndarray) -> np.ndarray:
        """The transfers (increasing) with an edge on the resources ``tight``, of a
        filling of every edge (:data:`LARGE` or more) whose first round fills some
        resources only: one ``logical_or`` per transfer's range of edges, the same set
        as the transfers of the edges on ``tight`` (:meth:`_EdgesOn.swept`), without
        each edge's transfer laid out."""
        flag = np.zeros(self.nres, dtype=bool)
        flag[tight] = True
        # the transfers with an edge: each one's range runs to the next one's start
        crossing = None if self.limited.all() else self.limited.nonzero()[0]
        hit = np.logical_or.reduceat(flag[self.res], self.task_at[:-1] if crossing is
                                     None else self.task_at[crossing])
        every: np.ndarray = np.flatnonzero(hit) if crossing is None else crossing[hit]
        return every

    def _demand(self, res: np.ndarray, frac: np.ndarray) -> np.ndarray:
        """``np.bincount(res, weights=frac, minlength=nres)``; where :attr:`whole` (each
        fraction 1.0), each resource's count of edges as a float: a sum of ones from 0.0
        is that count exactly (below 2**53), without the fractions read as weights (a
        read-only array of ones, :func:`_ones`, would be laid out whole for that)."""
        if self.whole:
            out: np.ndarray = np.bincount(res, minlength=self.nres).astype(np.float64)
            return out
        return np.bincount(res, weights=frac, minlength=self.nres)


@dataclass(frozen=True)
class Fill:
    """A max-min fair allocation.

    Attributes:
        rate: per transfer its rate (bytes/s; 0: not flowing, inf: crosses nothing).
        level: per resource the level it filled at (inf: not full; a full resource
            carries its capacity, and is the bottleneck of the transfers frozen there).
    """

    rate: np.ndarray
    level: np.ndarray


__all__ = ["TIGHT", "FairShare", "Fill", "Path", "distinct", "path_arrays", "ranges",
           "sorted_distinct"]

"""Large routes by form, many tasks at once (issue 62, round eleven): the routes
:func:`~reshard.planner.costing.route_forms.relabeled` finds task by task, found for a
call's large broadcasts and reductions together. A plan of a thousand trees over a
thousand devices ranks each tree's hosts, hashes its form and numbers its form's route
back one task at a time (some 150 us a tree); here every task's devices are read into
one array, their hosts ranked in the order first named by a handful of array
operations over all of them (the same integers: each host's rank is the count of hosts
first named before it), and the tasks of one form numbered back as one array.

Each task is judged as :func:`relabeled_or_own` judges it, in the call's order: its
form read from (or put in) the memo of forms, or its own search once a shape's first
:data:`RELABEL_TRIAL` tasks each had a form of its own. The same routes: a form's
route numbered back is the task's own (:mod:`~reshard.planner.costing.route_forms`),
its codes the same integers summed alike (``base + order[ranked] * span``)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import numpy as np

from reshard.planner.costing.fairshare import Path
from reshard.planner.costing.place_forms import PlaceForms
from reshard.planner.costing.route_forms import (
    ChainMemo,
    FormMemo,
    form_key,
    found_form,
    read_only_ones,
    relabeled,
)
from reshard.planner.values.plan_view import Route
from reshard.planner.values.tasks import Task

RELABEL_TRIAL = 64
"""Large tasks of one shape a :func:`~reshard.planner.costing.cost.task_routes` call
finds by form before it judges the forms (:func:`relabeled_or_own`)."""

Tried = dict[tuple[object, ...], list[int]]
"""Per shape (:func:`trial_shape`), a call's tasks found by form and those whose form
was in the memo already."""


def trial_shape(task: Task) -> tuple[object, ...]:
    """The shape a call judges its forms by (:data:`RELABEL_TRIAL`)."""
    return (task.kind, len(task.receivers), len(task.parents), len(task.addends))


def _counted(task: Task, tried: Tried) -> list[int] | None:
    """``task``'s shape's count in ``tried`` (made there), or None where its first
    :data:`RELABEL_TRIAL` tasks each had a form of its own (then each its own search)."""
    count = tried.get(shape := trial_shape(task))
    if count is None:
        count = tried[shape] = [0, 0]
    return None if count[0] >= RELABEL_TRIAL and not count[1] else count


def relabeled_or_own(task: Task, key: tuple[object, ...], step: tuple[int, int],
                     find: Callable[[], Route], memos: tuple[FormMemo, ChainMemo,
                                                             dict[int, np.ndarray]],
                     tried: Tried) -> Route:
    """``task``'s route by :func:`~reshard.planner.costing.route_forms.relabeled`
    (``memos``: forms, chains and read-only ones), or by its own search (``find``)
    where the call's first :data:`RELABEL_TRIAL` tasks of its shape (``tried``) each
    had a form of its own (a reduction over every device to each in turn): a form
    unread costs half a search. The same route either way."""
    count = _counted(task, tried)
    if count is None:  # no form met twice: each its own
        return find()
    forms = memos[0]
    before = len(forms)
    got = relabeled(task, key, step, find, forms, memos[1], memos[2])
    count[0] += 1
    count[1] += len(forms) == before
    return got


class RankedRows:
    """Tasks' devices (root, receivers, parents, addends, addend parents: rows of one
    length) renumbered by host in the order each row first names them: each row's form
    row (:func:`~reshard.planner.costing.route_forms.form_key`; equal ones one bytes
    object), host ranks and hosts in rank order, found :data:`BLOCK` rows at a time
    (:meth:`of`)."""

    def __init__(self) -> None:
        self.rows: list[bytes] = []  # each row's form row, equal ones one object
        self.distinct: dict[int, list[bytes]] = {}  # form rows, by a sampled sum
        self.numbers: list[np.ndarray] = []  # per block, each row's host ranks (-1: none)
        self.orders: list[np.ndarray] = []  # per block, its rows' hosts in rank order
        self.named: list[np.ndarray] = []  # per block, the hosts each row names
        empty = np.zeros(0, dtype=np.int64)
        self.order = empty  # every row's hosts in rank order, row by row (of())
        self.begin = self.counts = empty  # each row's first place there, and its hosts

    @classmethod
    def of(cls, tasks: Sequence[Task], devices: int,
           packed: Packed | None = None) -> RankedRows | None:
        """The rows of ``tasks`` (of one length in each role; ``devices`` a host)
        ranked; None where a device is below 0 (no table holds its host). ``packed``:
        receivers' tuples packed before (read and filled in, :func:`packed_receivers`)."""
        t0 = tasks[0]
        roles = (1, len(t0.receivers), len(t0.parents), len(t0.addends),
                 len(t0.addend_parents))
        one, *packs = (struct.Struct(f"{n}q").pack for n in roles)
        receivers, parents = packed_receivers(packs[0], packed), packs[1]
        plain = not (roles[3] or roles[4])  # no addends: their empty packs left out
        got = cls()
        # a block's hosts and form rows, written over block by block (each form row
        # kept as bytes): a few arrays of a block's size, not one each a block
        scratch = np.empty((2, min(BLOCK, len(tasks)), sum(roles)), dtype=np.int64)
        for lo in range(0, len(tasks), BLOCK):
            parts: list[bytes] = []
            if plain:  # a role a call: each tuple passed as it is
                for t in tasks[lo:lo + BLOCK]:
                    parts += (one(t.root), receivers(t.receivers), parents(*t.parents))
            else:
                for t in tasks[lo:lo + BLOCK]:
                    parts += (one(t.root), receivers(t.receivers), parents(*t.parents),
                              packs[2](*t.addends), packs[3](*t.addend_parents))
            rows = np.frombuffer(b"".join(parts), dtype=np.int64).reshape(-1, sum(roles))
            if int(rows.min()) < 0:
                return None
            got._rank(rows, devices, scratch[:, :len(rows)])
        begin = np.zeros(len(tasks), dtype=np.int64)
        named = np.concatenate(got.named)
        np.cumsum(named[:-1], out=begin[1:])
        got.begin, got.order, got.counts = begin, np.concatenate(got.orders), named
        return got

    def _rank(self, rows: np.ndarray, devices: int, scratch: np.ndarray) -> None:
        """Rank a block of ``rows`` (``devices`` a host): each host's rank the count
        of hosts its row names first before it (found run by run: devices come host
        by host). ``scratch``: two arrays of the rows' shape, written over."""
        hosts = _hosts(rows, devices, scratch[0])
        count, width = rows.shape
        spread = int(hosts.max()) + 1  # hosts a row's table holds
        flat = hosts.ravel()
        starts = np.empty(flat.shape, dtype=bool)  # compared as one row: each row's
        np.not_equal(flat[1:], flat[:-1], out=starts[1:])  # first place set after
        starts[::width] = True
        run = np.flatnonzero(starts)  # each run's start, row by row, place by place
        at = run // width
        place = run - at * width
        cell = at * spread + flat.take(run)  # (row, host) in one table
        first = np.full(count * spread, width, dtype=np.int64)
        np.minimum.at(first, cell, place)
        new = first[cell] == place  # a host's first run in its row (one per host)
        new_row, new_cell = at[new], cell[new]
        named = np.bincount(new_row, minlength=count)
        begin = np.zeros(count, dtype=np.int64)
        np.cumsum(named[:-1], out=begin[1:])
        number = np.full(count * spread, -1, dtype=np.int64)
        number[new_cell] = np.arange(len(new_cell), dtype=np.int64) - begin[new_row]
        # each device moved by (rank - host) hosts: _moves' integers, read by row
        move = (number.reshape(count, spread) - np.arange(spread, dtype=np.int64)) * devices
        hosts += (np.arange(count, dtype=np.int64) * spread)[:, None]
        # (every place in the table: "clip" clips none, and writes out= with no copy)
        formed = move.ravel().take(hosts, out=scratch[1], mode="clip")
        formed += rows
        self._kept(formed)
        self.numbers.append(number.reshape(count, spread))
        self.orders.append(new_cell - new_row * spread)
        self.named.append(named)

    def _kept(self, formed: np.ndarray) -> None:
        """Keep a block's form rows (``formed``) as bytes, rows equal to one kept
        before as that one (:attr:`distinct`, found by a weighted sum of every
        :data:`ROW_STRIDE`-th device of the row; rows whose sums meet told apart by
        their bytes): a call's thousands of rows have a few dozen forms, so the rows of
        one form share one object and a block's array is not kept (the same bytes)."""
        distinct = self.distinct
        sample = formed[:, ::ROW_STRIDE]
        sums = sample.dot(np.arange(1, sample.shape[1] + 1, dtype=np.int64)).tolist()
        rows = list(map(np.ndarray.tobytes, formed))
        for k, (total, same) in enumerate(zip(sums, map(distinct.get, sums))):
            if same is None:
                distinct[total] = [rows[k]]
                continue
            row = rows[k]
            for kept in same:
                if kept == row:
                    rows[k] = kept
                    break
            else:  # its sum met another row's
                same.append(row)
        self.rows += rows

    def row(self, i: int) -> bytes:
        """Row ``i``'s form row, as bytes."""
        return self.rows[i]

    def formed_row(self, i: int) -> np.ndarray:
        """Row ``i``'s form row (read only)."""
        return np.frombuffer(self.rows[i], dtype=np.int64)

    def number(self, i: int) -> np.ndarray:
        """Row ``i``'s host ranks (-1: a host it does not name)."""
        ranks: np.ndarray = self.numbers[i // BLOCK][i % BLOCK]
        return ranks

    def numbered_back(self, which: list[int], form: tuple[np.ndarray, np.ndarray, float],
                      ones: dict[int, np.ndarray]) -> list[Route]:
        """The routes of rows ``which``, all of form ``form`` (a :data:`~reshard.
        planner.costing.route_forms.FormMemo` entry), numbered back :data:`BLOCK` at a
        time as one array (each path a read-only row of it)."""
        base, (ranked, span), lat = form
        fracs = read_only_ones(len(base), ones)
        # one span for every code (as a form's usually is): the hosts scaled before
        # they are taken, a pass over the few hosts, not the many codes (the same ints)
        one = int(span[0]) if len(span) and bool((span == span[0]).all()) else None
        out: list[Route] = []
        for lo in range(0, len(which), BLOCK):
            at = np.array(which[lo:lo + BLOCK], dtype=np.int64)
            hosts = self.order[self.begin[at][:, None] +
                               np.arange(int(self.counts[at[0]]), dtype=np.int64)]
            if one is not None:
                hosts *= one
            codes = hosts.take(ranked, axis=1)  # base + order[ranked] * span, a row a task
            if one is None:
                codes *= span
            codes += base
            codes.flags.writeable = False  # its rows are paths' codes
            out += [(Path.of_codes(c, fracs), lat) for c in codes]
        return out


Packed = dict[int, tuple[tuple[int, ...], bytes]]
"""Receivers' tuples packed as 8-byte integers, by the tuple's ``id`` (each kept with
its tuple, so no other tuple takes its ``id`` while it is held)."""


def packed_receivers(pack: Callable[..., bytes], packed: Packed | None
                     ) -> Callable[[tuple[int, ...]], bytes]:
    """What packs a receivers' tuple by ``pack`` (passed its items), each tuple packed
    once in ``packed`` (by identity: the tasks of a call's plans over the same devices
    share their receivers' tuple; the same bytes)."""
    if packed is None:
        return lambda items: pack(*items)

    def receivers(items: tuple[int, ...]) -> bytes:
        got = packed.get(id(items))
        if got is not None and got[0] is items:
            return got[1]
        row = pack(*items)
        packed[id(items)] = (items, row)
        return row

    return receivers


def _hosts(rows: np.ndarray, devices: int, out: np.ndarray) -> np.ndarray:
    """The host of each of ``rows``' devices (none below 0), ``devices`` a host, written
    in ``out``: a shift where that is a power of 2 (the same integers as ``//``, in half
    the time)."""
    if devices & (devices - 1):
        np.floor_divide(rows, devices, out=out)
    else:
        np.right_shift(rows, devices.bit_length() - 1, out=out)
    return out


ROW_STRIDE = 8
"""Devices between those of a form row's sample by which :meth:`RankedRows._kept` finds
an equal row kept before (a weighted sum of the sample: an eighth of the row's work)."""

BLOCK = 32
"""Rows ranked, or numbered back, as one array (:class:`RankedRows`): a thousand trees'
rows of 2,000 devices at once are arrays of 16 MB a pass, read and written from memory;
a few dozen stay in the cache."""


def relabeled_many(tasks: Sequence[Task], keys: Sequence[tuple[object, ...]],
                   step: tuple[int, int], finder: Callable[[Task], Callable[[], Route]],
                   memos: tuple[FormMemo, dict[int, np.ndarray]], tried: Tried,
                   nic: np.ndarray | None = None,
                   packed: Packed | None = None) -> list[Route] | None:
    """:func:`relabeled_or_own` of each of ``tasks`` (distinct ``keys``; ``memos``:
    forms and read-only ones), in order, each row's form found at once
    (:class:`RankedRows`, rows of one length in each role together) and the tasks of each form met
    again numbered back together; None (nothing found) where a device is below 0.
    ``nic``: each device's NIC, where a form not in the memo may be numbered from its
    place form's route (:mod:`~reshard.planner.costing.place_forms`; the same route as
    its search, which it replaces). ``packed``: receivers' tuples packed before (read
    and filled in, :func:`packed_receivers`)."""
    forms, ones = memos
    places = None if nic is None else PlaceForms.of(step, nic)
    by_width: dict[tuple[int, ...], list[int]] = {}  # by the lengths of the roles
    for i, t in enumerate(tasks):
        by_width.setdefault((len(t.receivers), len(t.parents), len(t.addends),
                             len(t.addend_parents)), []).append(i)
    ranked: list[tuple[RankedRows, int]] = [None] * len(tasks)  # type: ignore[list-item]
    for idx in by_width.values():
        rows = RankedRows.of([tasks[i] for i in idx], step[0], packed)
        if rows is None:  # a device below 0: task by task
            return None
        for j, i in enumerate(idx):
            ranked[i] = (rows, j)
    out: list[Route | None] = [None] * len(tasks)
    met: dict[int, tuple[RankedRows, tuple[np.ndarray, np.ndarray, float], list[int]]] = {}
    for i, (t, key) in enumerate(zip(tasks, keys)):
        count = _counted(t, tried)
        if count is None:
            out[i] = finder(t)()
            continue
        rows, j = ranked[i]
        form = form_key(t, key, rows.row(j))
        got = forms.get(form)
        count[0] += 1
        if got is None:
            got, route = _unmet(form, (rows, j), places, step, finder(t), forms)
            if got is None:  # searched: the task's own route
                out[i] = route
                continue
        else:
            count[1] += 1
        # a form's tasks have roles of one length: their rows are of one RankedRows
        met.setdefault(id(got), (rows, got, []))[2].append(i)
    for rows, got, which in met.values():
        for i, route in zip(which, rows.numbered_back([ranked[i][1] for i in which], got,
                                                      ones)):
            out[i] = route
    return out  # type: ignore[return-value]  # every task's filled in


def _unmet(form: tuple[object, ...], row: tuple[RankedRows, int], places: PlaceForms | None,
           step: tuple[int, int], find: Callable[[], Route], forms: FormMemo
           ) -> tuple[tuple[np.ndarray, np.ndarray, float], None] | tuple[None, Route]:
    """The memo entry of ``form`` (``row``: the rows and place of its task's, not in
    ``forms``) numbered from its place form's route (``places``; put in ``forms``), or
    else the task's route by its own search ``find`` (:func:`~reshard.planner.costing.
    route_forms.found_form`; its form, and its place form's, put in ``forms``)."""
    rows, j = row
    if places is None:
        return None, found_form(form, rows.number(j), step, find, forms)
    probe = places.probe(form, rows.formed_row(j))
    got = places.derived(form, probe, forms)
    if got is not None:
        return got, None
    route = found_form(form, rows.number(j), step, find, forms)
    places.remember(form, probe, forms)
    return None, route


__all__ = ["RELABEL_TRIAL", "Packed", "RankedRows", "Tried", "packed_receivers",
           "relabeled_many", "relabeled_or_own", "trial_shape"]

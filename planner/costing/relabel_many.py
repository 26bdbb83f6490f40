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
    """Tasks' devices (``rows``: :func:`_rows`, none below 0) renumbered by host in the order each row first names them: each row's
    form row (:func:`~reshard.planner.costing.route_forms.form_key`), host ranks and
    hosts in rank order, found for all rows at once."""

    def __init__(self, rows: np.ndarray, devices: int) -> None:
        hosts = rows // devices
        count, width = rows.shape
        spread = int(hosts.max()) + 1  # hosts a row's table holds
        # each run of one host (devices come host by host): its row and place
        starts = np.ones(rows.shape, dtype=bool)
        starts[:, 1:] = hosts[:, 1:] != hosts[:, :-1]
        at, place = np.nonzero(starts)  # row by row, place by place
        cell = at * spread + hosts[at, place]  # (row, host) in one table
        first = np.full(count * spread, width, dtype=np.int64)
        np.minimum.at(first, cell, place)
        new = first[cell] == place  # a host's first run in its row (one per host)
        new_row, new_cell = at[new], cell[new]
        named = np.bincount(new_row, minlength=count)  # hosts each row names
        begin = np.zeros(count, dtype=np.int64)
        np.cumsum(named[:-1], out=begin[1:])
        number = np.full(count * spread, -1, dtype=np.int64)
        number[new_cell] = np.arange(len(new_cell), dtype=np.int64) - begin[new_row]
        self.number = number.reshape(count, spread)  # each row's host ranks (-1: none)
        move = (self.number - np.arange(spread, dtype=np.int64)) * devices
        self.formed = (rows + np.take_along_axis(move, hosts, axis=1)).tobytes()
        self.width = 8 * width
        self.order = new_cell - new_row * spread  # rows' hosts in rank order, row by row
        self.begin, self.named = begin, named

    def row(self, i: int) -> bytes:
        """Row ``i``'s form row, as bytes."""
        return self.formed[i * self.width:(i + 1) * self.width]

    def numbered_back(self, which: list[int], form: tuple[np.ndarray, np.ndarray, float],
                      ones: dict[int, np.ndarray]) -> list[Route]:
        """The routes of rows ``which``, all of form ``form`` (a :data:`~reshard.
        planner.costing.route_forms.FormMemo` entry), numbered back as one array (each
        path a read-only row of it)."""
        base, (ranked, span), lat = form
        at = np.array(which, dtype=np.int64)
        hosts = self.order[self.begin[at][:, None] +
                           np.arange(int(self.named[at[0]]), dtype=np.int64)]
        codes = base + hosts[:, ranked] * span
        codes.flags.writeable = False  # its rows are paths' codes
        fracs = read_only_ones(len(base), ones)
        return [(Path.of_codes(c, fracs), lat) for c in codes]


def _rows(tasks: Sequence[Task]) -> np.ndarray:
    """The devices of ``tasks`` (rows of one length) in role order, one row a task,
    packed as 8-byte integers by one ``struct`` call a task."""
    t0 = tasks[0]
    width = 1 + len(t0.receivers) + len(t0.parents) + len(t0.addends) + \
        len(t0.addend_parents)
    pack = struct.Struct(f"{width}q").pack
    packed = b"".join([pack(t.root, *t.receivers, *t.parents, *t.addends, *t.addend_parents)
                       for t in tasks])
    return np.frombuffer(packed, dtype=np.int64).reshape(len(tasks), width)


def relabeled_many(tasks: Sequence[Task], keys: Sequence[tuple[object, ...]],
                   step: tuple[int, int], finder: Callable[[Task], Callable[[], Route]],
                   memos: tuple[FormMemo, dict[int, np.ndarray]], tried: Tried
                   ) -> list[Route] | None:
    """:func:`relabeled_or_own` of each of ``tasks`` (distinct ``keys``; ``memos``:
    forms and read-only ones), in order, each row's form found at once
    (:class:`RankedRows`, rows of one length together) and the tasks of each form met
    again numbered back together; None (nothing found) where a device is below 0."""
    forms, ones = memos
    by_width: dict[int, list[int]] = {}
    for i, t in enumerate(tasks):
        by_width.setdefault(len(t.receivers) + len(t.parents) + len(t.addends)
                            + len(t.addend_parents), []).append(i)
    ranked: list[tuple[RankedRows, int]] = [None] * len(tasks)  # type: ignore[list-item]
    for idx in by_width.values():
        devices = _rows([tasks[i] for i in idx])
        if int(devices.min()) < 0:  # no table holds its host: task by task
            return None
        rows = RankedRows(devices, step[0])
        for j, i in enumerate(idx):
            ranked[i] = (rows, j)
    out: list[Route | None] = [None] * len(tasks)
    met: dict[tuple[int, int], tuple[RankedRows, tuple[np.ndarray, np.ndarray, float], list[int]]] = {}
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
            out[i] = found_form(form, rows.number[j], step, finder(t), forms)
            continue
        count[1] += 1
        met.setdefault((id(got), id(rows)), (rows, got, []))[2].append(i)
    for rows, got, which in met.values():
        for i, route in zip(which, rows.numbered_back([ranked[i][1] for i in which], got,
                                                      ones)):
            out[i] = route
    return out  # type: ignore[return-value]  # every task's filled in


__all__ = ["RELABEL_TRIAL", "RankedRows", "Tried", "relabeled_many", "relabeled_or_own",
           "trial_shape"]

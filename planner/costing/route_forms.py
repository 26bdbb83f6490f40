"""Routes found once per form (issue 62): on a regular cluster (host ``h`` holds devices
``h * g ... h * g + g - 1``, its NICs numbered ``h * n`` on in the same way for every
host, no shared bandwidth: :meth:`~reshard.planner.costing.cost.Hops.host_step`) a
bijection of hosts that keeps every device's and NIC's place in its host maps every
resource to one of the same kind and capacity. A broadcast's or reduction's route is
its edges' hops in order (every fraction 1) and its latency is summed edge by edge from
which edges cross hosts and how many children each sender feeds: the route of a task
so moved is the task's route, moved resource by resource, with the same latency (the
same floats, summed in the same order). So a route is searched once per form and
numbered back for every task of that form:

* :func:`shifted` (a few edges): the task moved by whole hosts so that its root is in
  host 0;
* :func:`relabeled` (many edges): the task's hosts renumbered in the order its devices
  first name them (a chain's shifts over the hosts share one form).

Pure: each takes the search of the task's own route (``find``) and a memo of forms.
"""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Callable, Sequence, Sized

import numpy as np

from reshard.planner.costing.fairshare import Path, path_arrays
from reshard.planner.costing.sampled_keys import SampledKey, every
from reshard.planner.values.plan_view import Route
from reshard.planner.values.resources import KIND_CODE, NIC_IN
from reshard.planner.values.tasks import Task

FormMemo = dict[tuple[object, ...], tuple[np.ndarray, np.ndarray, float]]
"""Per form: its route's codes there (:func:`relabeled`: less each code's host's part),
what each code moves by a host on (:func:`shifted`; :func:`relabeled`: each code's host's
rank and the codes a host spans) and its latency."""


def shifted(task: Task, key: tuple[object, ...], step: tuple[int, int],
            find: Callable[[], Route], memo: FormMemo) -> Route:
    """``task``'s route (``key``: its route key, ``find``: its search) on a regular
    cluster (``step``: devices and NICs a host): the route of the task moved by whole
    hosts to its root's place in host 0, found once in ``memo``, moved back (every
    device's resource by ``k`` hosts' devices, every NIC's by ``k`` hosts' NICs)."""
    devices = step[0]
    k = task.root // devices
    home = _home(task, key, k, devices)
    got = memo.get(home)
    if got is None:
        return _found_home(home, k, step, find, memo)
    home_codes, moves, lat = got
    return Path.of_codes(home_codes + k * moves), lat


def _found_home(home: tuple[object, ...], k: int, step: tuple[int, int],
                find: Callable[[], Route], memo: FormMemo) -> Route:
    """The route ``find`` searches for a task ``k`` hosts on from its form ``home``
    (:func:`shifted`), that form's codes (each moved back by the codes its host spans)
    put in ``memo``."""
    path, lat = find()
    codes = path_arrays(path)[0]
    unit = _spans(codes, step)  # what each code moves by a host on
    memo[home] = (codes - k * unit, unit, lat)
    return path, lat


def _home(task: Task, key: tuple[object, ...], k: int, devices: int) -> tuple[object, ...]:
    """:func:`shifted`'s form of ``task`` (``key``: its route key), moved ``k`` hosts
    of ``devices`` devices back."""
    less = itertools.repeat(k * devices)
    sub = operator.sub
    return ("home", key[0], task.root - k * devices, tuple(map(sub, task.receivers, less)),
            tuple(map(sub, task.parents, less)), tuple(map(sub, task.addends, less)),
            tuple(map(sub, task.addend_parents, less)), *key[6:])


def shifted_many(tasks: Sequence[Task], keys: Sequence[tuple[object, ...]],
                 step: tuple[int, int], finder: Callable[[Task], Callable[[], Route]],
                 memo: FormMemo) -> list[Route]:
    """:func:`shifted` of each of ``tasks`` (distinct ``keys``; ``finder``: what searches
    a task's own route), the same routes found at once: the tasks of one shape (kind,
    counts of devices in each role, key's tail) as one array, moved home together,
    each distinct form found (or read) once, at its first task as :func:`shifted`
    would, every task's codes its form's moved back in one array operation."""
    groups = _shapes(keys)
    out: list[Route | None] = [None] * len(tasks)
    for idx in groups.values():
        for i, got in zip(idx, _shift_group([tasks[i] for i in idx], [keys[i] for i in idx],
                                            step, finder, memo)):
            out[i] = got
    return out  # type: ignore[return-value]  # every task's filled in


def _shapes(keys: Sequence[tuple[object, ...]]) -> dict[tuple[object, ...], list[int]]:
    """The places of route keys ``keys`` (:func:`~reshard.planner.costing.cost.
    route_key`) by shape: kind, counts of devices in each role and the key's tail, in
    the order first met; one group at once where each of these is one value over every
    key (found by ``map``s, no loop: a plan's 131,072 tasks are mostly of one shape)."""
    widths = set(map(len, keys))
    if len(widths) == 1 and (width := widths.pop()) >= 6:
        get = operator.itemgetter
        columns = [map(get(0), keys), *(map(len, map(get(r), keys)) for r in range(2, 6)),
                   *(map(get(r), keys) for r in range(6, width))]
        if all(len(set(column)) == 1 for column in columns):
            return {_shape(keys[0]): list(range(len(keys)))}
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(_shape(k), []).append(i)
    return groups


def _shape(key: tuple[object, ...]) -> tuple[object, ...]:
    """A route key's shape (:func:`_shapes`)."""
    roles: tuple[Sized, ...] = key[2:6]  # type: ignore[assignment]  # device tuples
    return (key[0], *map(len, roles), *key[6:])


def _shift_group(tasks: list[Task], keys: list[tuple[object, ...]], step: tuple[int, int],
                 finder: Callable[[Task], Callable[[], Route]], memo: FormMemo
                 ) -> list[Route]:
    """:func:`shifted_many` of tasks of one shape."""
    devices = step[0]
    rows = np.array([(t.root, *t.receivers, *t.parents, *t.addends, *t.addend_parents)
                     for t in tasks], dtype=np.int64)
    k = rows[:, 0] // devices
    home = np.ascontiguousarray(rows - (k * devices)[:, None]).tobytes()
    width = 8 * rows.shape[1]
    number: dict[bytes, int] = {}  # each distinct form's number, in order first met
    form_of = np.fromiter((number.setdefault(home[at:at + width], len(number))
                           for at in range(0, len(home), width)), dtype=np.int64,
                          count=len(tasks))
    first = np.full(len(number), len(tasks), dtype=np.int64)
    np.minimum.at(first, form_of, np.arange(len(tasks), dtype=np.int64))
    out: list[Route | None] = [None] * len(tasks)
    forms = []
    for r in first.tolist():  # each form at its first task, in the memo or found there
        kr = int(k[r])
        home_key = _home(tasks[r], keys[r], kr, devices)
        if home_key not in memo:
            out[r] = _found_home(home_key, kr, step, finder(tasks[r]), memo)
        forms.append(memo[home_key])
    lats = [lat for _, _, lat in forms]
    size = np.fromiter((len(codes) for codes, _, _ in forms), dtype=np.int64,
                       count=len(forms))
    for length in np.unique(size, return_index=True)[0].tolist():  # forms of one length
        of_length = np.flatnonzero(size == length)
        row = np.full(len(forms), -1, dtype=np.int64)
        row[of_length] = np.arange(len(of_length))
        mine = np.flatnonzero(row[form_of] >= 0)  # their tasks, in order
        at = row[form_of[mine]]
        moved = np.stack([forms[f][0] for f in of_length.tolist()])[at] + \
            k[mine][:, None] * np.stack([forms[f][1] for f in of_length.tolist()])[at]
        ones = np.ones(length)
        ones.flags.writeable = False  # shared by these paths
        for i, f, codes in zip(mine.tolist(), form_of[mine].tolist(), moved):
            if out[i] is None:
                out[i] = (Path.of_codes(codes, ones), lats[f])
    return out  # type: ignore[return-value]  # every task's filled in


ChainMemo = dict[tuple[object, ...],
                 tuple[bytes, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
"""Per root and receivers (:func:`relabeled`): their form row's bytes, their hosts in
the order first named, each host's rank (-1: not named), what each host's devices
move by to their renumbered host, and the ranks between two -1s (:func:`_guard`)."""


def relabeled(task: Task, key: tuple[object, ...], step: tuple[int, int],
              find: Callable[[], Route], memo: FormMemo,
              chains: ChainMemo | None = None,
              ones: dict[int, np.ndarray] | None = None) -> Route:
    """``task``'s route (``key``: its route key, ``find``: its search) on a regular
    cluster (``step``: devices and NICs a host): the route of the task with its hosts
    renumbered in the order its devices first name them (each device keeping its place
    in its host), found once in ``memo``, numbered back. ``chains``: the root and
    receivers' part of that renumbering already found (filled in; tasks of one chain
    in other trees share it). ``ones``: read-only fractions (every one 1.0) by length,
    shared by the routes numbered back (filled in; else each gets its own)."""
    devices = step[0]
    row, order, number = _host_ranks(task, devices, chains)
    form = form_key(task, key, row)
    got = memo.get(form)
    if got is None:
        return found_form(form, number, step, find, memo)
    base, (ranked, span), lat = got
    return Path.of_codes(base + order[ranked] * span,
                         None if ones is None else read_only_ones(len(base), ones)), lat


def read_only_ones(n: int, ones: dict[int, np.ndarray]) -> np.ndarray:
    """``n`` fractions of 1.0, read only, kept in ``ones`` by length: paths of as many
    codes share them (a writer would raise, not change another path's)."""
    got = ones.get(n)
    if got is None:
        got = ones[n] = np.ones(n)
        got.flags.writeable = False
    return got


FORM_STRIDE = 24
"""A form row's sample (:func:`form_key`): every this many of its bytes."""


def form_key(task: Task, key: tuple[object, ...], row: bytes) -> SampledKey:
    """:func:`relabeled`'s key of the form of ``task`` (``key``: its route key, ``row``:
    its form row): its kind, counts of devices in each role, row and key's tail, hashed
    by a sample of the row (:class:`~reshard.planner.costing.sampled_keys.SampledKey`;
    every form key is made here)."""
    head = ("hosts", key[0], len(task.receivers), len(task.parents), len(task.addends))
    tail = key[6:]
    return SampledKey.of((*head, row, *tail), (*head, every(row, FORM_STRIDE), *tail))


def chain_key(task: Task) -> SampledKey:
    """A :data:`ChainMemo` key: ``task``'s root and receivers, hashed by a sample of
    them (every chain key is made here)."""
    return SampledKey.of((task.root, task.receivers),
                         (task.root, every(task.receivers, CHAIN_STRIDE)))


CHAIN_STRIDE = 8
"""A chain key's sample (:func:`chain_key`): every this many of its receivers."""


def found_form(form: tuple[object, ...], number: np.ndarray, step: tuple[int, int],
               find: Callable[[], Route], memo: FormMemo) -> Route:
    """The route ``find`` searches for a task of form ``form`` (:func:`relabeled`;
    ``number``: each of its hosts' rank), that form's codes (less their hosts' part,
    with each one's host's rank and span) put in ``memo``."""
    path, lat = find()
    codes = path_arrays(path)[0]
    host, span = _code_hosts(codes, step)
    assert (number[host] >= 0).all()  # every resource is of a host the task names
    ranked = number[host]
    # kept as the codes less their hosts' part, and the rank and span of each
    memo[form] = (codes - host * span, np.stack((ranked, span)), lat)
    return path, lat


def _host_ranks(task: Task, devices: int, chains: ChainMemo | None
                ) -> tuple[bytes, np.ndarray, np.ndarray]:
    """:func:`relabeled`'s form row of ``task`` (as bytes), its hosts in the order
    first named and each host's rank. A task whose only other role is its parents, each
    in a host its root or receivers name, ranks its hosts as they do (the parents come
    after them and name no new host): the root and receivers' part is read from
    ``chains`` (found there once), the parents' row put after it."""
    if chains is None or task.addends or task.addend_parents:
        return _ranked_row(_devices_row(task), devices)[:3]
    head_key = chain_key(task)
    head = chains.get(head_key)
    if head is None:
        row, order, number, move = _ranked_row(_devices_row(task, heads_only=True), devices)
        head = chains[head_key] = (row, order, number, move, _guard(number))
    row, order, number, move, guard = head
    if not task.parents:
        return row, order, number
    parents = _int_row(task.parents)
    hosts = parents // devices
    if int(guard.take(hosts + 1, mode="clip").min()) < 0:  # a parent's host not named
        return _ranked_row(_devices_row(task), devices)[:3]
    return row + (parents + move[hosts]).tobytes(), order, number


def _guard(number: np.ndarray) -> np.ndarray:
    """Host ranks ``number`` (-1: not named) with a -1 at each end: read at ``host + 1``
    with its places clipped to its ends, a host below 0 or past ``number`` reads -1,
    any other its rank, so one ``take`` and one ``min`` tell whether every host is
    named (:func:`_host_ranks`)."""
    return np.concatenate(([-1], number, [-1]))


def _ranked_row(ds: np.ndarray, devices: int
                ) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """Devices ``ds`` (``devices`` a host) renumbered by host in the order first named
    (as bytes), those hosts in that order, each host's rank (-1: not named) and what
    each host's devices move by (:func:`_renumbered`)."""
    hosts = ds // devices
    # the hosts in the order first named, run by run (devices come host by host)
    runs = np.concatenate((hosts[:1], hosts[np.flatnonzero(hosts[1:] != hosts[:-1]) + 1]))
    order = _first_named(runs)
    number = np.full(int(order.max()) + 1, -1, dtype=np.int64)
    number[order] = np.arange(len(order))  # each host's rank (distinct hosts: exact)
    move = _moves(number, devices)
    return (ds + move[hosts]).tobytes(), order, number, move


def _first_named(runs: np.ndarray) -> np.ndarray:
    """The distinct ``runs`` in the order first met (``dict.fromkeys``'s): where none is
    negative, each one's first place found by one ``np.minimum.at`` over a table of
    them (exact integers; the places differ, so their sort has one answer)."""
    if int(runs.min()) < 0:  # a table cannot hold it: as a dict
        return np.array(list(dict.fromkeys(runs.tolist())), dtype=np.int64)
    first = np.full(int(runs.max()) + 1, len(runs), dtype=np.int64)
    np.minimum.at(first, runs, np.arange(len(runs), dtype=np.int64))
    named = np.flatnonzero(first < len(runs))
    return named[np.argsort(first[named])]


def _moves(number: np.ndarray, devices: int) -> np.ndarray:
    """What a device of each host moves by to host ``number[host]`` at its place there
    (``devices`` a host): ``number[host] * devices + place`` as
    ``device + (number[host] - host) * devices`` (the same integers)."""
    return (number - np.arange(len(number))) * devices


def _devices_row(task: Task, heads_only: bool = False) -> np.ndarray:
    """``task``'s root, receivers, parents, addends and addend parents in one array
    (``heads_only``: its root and receivers), packed as 8-byte integers by one
    ``struct`` call and read as one: the same numbers in less than half the time of a
    ``np.fromiter`` per role."""
    if heads_only:  # the root and receivers packed by one call, no tuple between
        return np.frombuffer(struct.pack(f"{len(task.receivers) + 1}q", task.root,
                                         *task.receivers), dtype=np.int64)
    return _int_row((task.root, *task.receivers, *task.parents, *task.addends,
                     *task.addend_parents))


def _int_row(values: tuple[int, ...]) -> np.ndarray:
    """``values`` as an array of 8-byte integers (packed by ``struct``: the same
    numbers)."""
    return np.frombuffer(struct.pack(f"{len(values)}q", *values), dtype=np.int64)


def _code_hosts(codes: np.ndarray, step: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The host of each resource ``codes`` names on a regular cluster (``step``), and
    the codes a host spans (:func:`_spans`)."""
    span = _spans(codes, step)
    return codes // span, span


def _spans(codes: np.ndarray, step: tuple[int, int]) -> np.ndarray:
    """The codes a host spans for each resource ``codes`` names on a regular cluster
    (``step``): its NICs' for a NIC, its devices' for a device."""
    devices, nics = step
    return np.where(codes % 8 <= KIND_CODE[NIC_IN], 8 * nics, 8 * devices)


__all__ = ["ChainMemo", "FormMemo", "chain_key", "form_key", "found_form", "read_only_ones",
           "relabeled", "shifted", "shifted_many"]

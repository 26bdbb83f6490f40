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


def relabeled(task: Task, key: tuple[object, ...], step: tuple[int, int],
              find: Callable[[], Route], memo: FormMemo) -> Route:
    """``task``'s route (``key``: its route key, ``find``: its search) on a regular
    cluster (``step``: devices and NICs a host): the route of the task with its hosts
    renumbered in the order its devices first name them (each device keeping its place
    in its host), found once in ``memo``, numbered back."""
    devices = step[0]
    ds = _devices_row(task)
    hosts = ds // devices
    # the hosts in the order first named, run by run (devices come host by host)
    runs = hosts[np.flatnonzero(hosts[1:] != hosts[:-1]) + 1].tolist()
    order = np.array(list(dict.fromkeys([int(hosts[0]), *runs])), dtype=np.int64)
    number = np.full(int(order.max()) + 1, -1, dtype=np.int64)
    number[order] = np.arange(len(order))  # each host's rank (distinct hosts: exact)
    form = ("hosts", key[0], len(task.receivers), len(task.parents), len(task.addends),
            _renumbered(ds, hosts, number, devices).tobytes(), *key[6:])
    got = memo.get(form)
    if got is None:
        path, lat = find()
        codes = path_arrays(path)[0]
        host, span = _code_hosts(codes, step)
        assert (number[host] >= 0).all()  # every resource is of a host the task names
        ranked = number[host]
        # kept as the codes less their hosts' part, and the rank and span of each
        memo[form] = (codes - host * span, np.stack((ranked, span)), lat)
        return path, lat
    base, (ranked, span), lat = got
    return Path.of_codes(base + order[ranked] * span), lat


def _renumbered(ds: np.ndarray, hosts: np.ndarray, number: np.ndarray,
                devices: int) -> np.ndarray:
    """Devices ``ds`` (of ``hosts``, ``devices`` a host) each moved to host
    ``number[host]`` at its place there: ``number[host] * devices + place`` as
    ``ds + (number[host] - host) * devices`` (one gather and one sum; the same
    integers)."""
    return ds + ((number - np.arange(len(number))) * devices)[hosts]


def _devices_row(task: Task) -> np.ndarray:
    """``task``'s root, receivers, parents, addends and addend parents in one array
    (packed as 8-byte integers by one ``struct`` call and read as one: the same numbers
    in less than half the time of a ``np.fromiter`` per role)."""
    n = 1 + len(task.receivers) + len(task.parents) + len(task.addends) + \
        len(task.addend_parents)
    packed = struct.pack(f"{n}q", task.root, *task.receivers, *task.parents,
                         *task.addends, *task.addend_parents)
    return np.frombuffer(packed, dtype=np.int64)


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


__all__ = ["FormMemo", "relabeled", "shifted", "shifted_many"]

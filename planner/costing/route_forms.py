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
from collections.abc import Callable

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
    less = itertools.repeat(k * devices)
    sub = operator.sub
    home = ("home", key[0], task.root - k * devices, tuple(map(sub, task.receivers, less)),
            tuple(map(sub, task.parents, less)), tuple(map(sub, task.addends, less)),
            tuple(map(sub, task.addend_parents, less)), *key[6:])
    got = memo.get(home)
    if got is None:
        path, lat = find()
        codes = path_arrays(path)[0]
        unit = _spans(codes, step)  # what each code moves by a host on
        memo[home] = (codes - k * unit, unit, lat)
        return path, lat
    home_codes, moves, lat = got
    return Path.of_codes(home_codes + k * moves), lat


def relabeled(task: Task, key: tuple[object, ...], step: tuple[int, int],
              find: Callable[[], Route], memo: FormMemo) -> Route:
    """``task``'s route (``key``: its route key, ``find``: its search) on a regular
    cluster (``step``: devices and NICs a host): the route of the task with its hosts
    renumbered in the order its devices first name them (each device keeping its place
    in its host), found once in ``memo``, numbered back."""
    devices = step[0]
    parts = ((task.root,), task.receivers, task.parents, task.addends, task.addend_parents)
    ds = np.fromiter(itertools.chain.from_iterable(parts), dtype=np.int64,
                     count=sum(map(len, parts)))
    hosts, place = np.divmod(ds, devices)
    # the hosts in the order first named, run by run (devices come host by host)
    runs = hosts[np.flatnonzero(hosts[1:] != hosts[:-1]) + 1].tolist()
    order = np.array(list(dict.fromkeys([int(hosts[0]), *runs])), dtype=np.int64)
    number = np.full(int(order.max()) + 1, -1, dtype=np.int64)
    number[order] = np.arange(len(order))  # each host's rank (distinct hosts: exact)
    form = ("hosts", key[0], len(task.receivers), len(task.parents), len(task.addends),
            (number[hosts] * devices + place).tobytes(), *key[6:])
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


__all__ = ["FormMemo", "relabeled", "shifted"]

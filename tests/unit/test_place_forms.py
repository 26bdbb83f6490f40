"""Route forms up to the places inside each host (issue 62, round twelve): a form whose
place form (:class:`place_forms.PlaceForms`) was met takes its route from that form's,
numbered, instead of its own search. It must be the task's own route bit for bit (codes
and latency) and leave the same memo entry, trial counts and routes as the search: on
one NIC a device (the preset, relay pieces, hosts that list their devices in another
order) and one NIC a host; clusters where a renumbering of places would move a shared
NIC (two NICs a host of 8) keep the search."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from reshard import Cluster
from reshard.planner.costing import cost
from reshard.planner.costing.cost import Hops, Routes, task_path, task_routes
from reshard.planner.costing.fairshare import Path, path_arrays
from reshard.planner.costing.place_forms import PlaceForms
from reshard.planner.costing.relabel_many import relabeled_many
from reshard.planner.costing.route_forms import form_key
from reshard.planner.costing.route_keys import route_key
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit._regular_clusters import regular_clusters

HOSTS, GPUS = 24, 8


def _clusters() -> dict[str, Cluster]:
    """The three regular clusters, one NIC a host, and hosts listing their devices in
    a turned order (each device's NIC its place in that order: not its own number)."""
    got = regular_clusters(HOSTS, GPUS)
    plain = got["pieces"]
    got["one-nic"] = dataclasses.replace(plain, nics_per_host=1, relay_piece=0)
    turned = tuple(tuple(h * GPUS + (p + 3) % GPUS for p in range(GPUS)) for h in range(HOSTS))
    got["turned"] = dataclasses.replace(plain, hosts=turned)
    return got


SYMMETRIC = ("preset", "pieces", "one-nic", "turned")


def _task(rng: random.Random, k: int) -> Task:
    """A broadcast chain or tree, a fused sum or a reduction of ``k`` receivers, host
    by host or not."""
    picked = rng.sample(range(HOSTS * GPUS), k + 1)
    if rng.random() < 0.6:
        picked.sort(key=lambda d: (d // GPUS, rng.random()))
    root, receivers = picked[0], tuple(picked[1:])
    kind = rng.choice([TaskKind.BROADCAST, TaskKind.BROADCAST, TaskKind.REDUCE])
    parents: tuple[int, ...] = ()
    addends: tuple[int, ...] = ()
    addend_parents: tuple[int, ...] = ()
    if kind is TaskKind.BROADCAST and rng.random() < 0.6:
        parents = tuple(rng.choice((root, *receivers[:j])) for j in range(k))
    if kind is TaskKind.BROADCAST and rng.random() < 0.3:
        addends = tuple(rng.sample([d for d in range(HOSTS * GPUS) if d not in picked], 4))
        addend_parents = (root, addends[0], root, addends[2])
    return Task(kind, 0, ((0, 8),), root, receivers, rng.choice([1000, 3 << 22]), 0,
                parents=parents, addends=addends, addend_parents=addend_parents)


def _moved(t: Task, hosts: list[int], places: list[list[int]]) -> Task:
    """``t`` with each device of host ``h`` moved to host ``hosts[h]``, its place ``p``
    to ``places[h][p]`` (a twin up to places)."""
    def move(ds: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(hosts[d // GPUS] * GPUS + places[d // GPUS][d % GPUS] for d in ds)

    return dataclasses.replace(t, root=move((t.root,))[0], receivers=move(t.receivers),
                               parents=move(t.parents), addends=move(t.addends),
                               addend_parents=move(t.addend_parents))


def _twins(rng: random.Random, forms: int) -> list[Task]:
    """``forms`` tasks, each with twins over renumbered hosts and places (some over
    renumbered hosts alone), shuffled."""
    tasks = []
    for _ in range(forms):
        t = _task(rng, rng.randint(cost.ARRAY_EDGES, 100))
        tasks.append(t)
        for j in range(rng.randint(2, 5)):
            hosts = list(range(HOSTS))
            rng.shuffle(hosts)
            places = [rng.sample(range(GPUS), GPUS) if j % 3 else list(range(GPUS))
                      for _ in range(HOSTS)]
            tasks.append(_moved(t, hosts, places))
    rng.shuffle(tasks)
    return tasks


def _many(tasks: list[Task], cluster: Cluster, places: bool):
    """``relabeled_many`` of ``tasks`` (distinct keys), with place forms or not: the
    routes, the memo of forms, the trial counts and the tasks searched."""
    hops = Hops()
    hops.cluster = cluster
    step = hops.host_step(cluster)
    assert step is not None
    todo = {route_key(t, 0, 0, False): t for t in tasks}
    keys, tasks = list(todo), list(todo.values())
    searched: list[Task] = []

    def finder(t):
        def find():
            searched.append(t)
            path, lat = task_path(t, cluster, Hops())
            return (path if isinstance(path, Path) else Path(path)), lat
        return find

    tried: dict = {}
    got = relabeled_many(tasks, keys, step, finder, (hops.forms(), hops.ones()), tried,
                         hops.arrays(cluster)[1] if places else None)
    assert got is not None
    return tasks, got, hops.forms(), tried, searched


@pytest.mark.parametrize("name", list(_clusters()))
@pytest.mark.parametrize("seed", range(4))
def test_place_forms_give_each_task_its_own_route(name, seed):
    cluster = _clusters()[name]
    tasks = _twins(random.Random(seed), 6)
    tasks, got, forms, tried, searched = _many(tasks, cluster, True)
    _, plain, plain_forms, plain_tried, plain_searched = _many(tasks, cluster, False)
    for t, (path, lat), (path_b, lat_b) in zip(tasks, got, plain):
        want, want_lat = task_path(t, cluster, Hops())
        assert lat == lat_b == want_lat  # the same float
        assert path_arrays(path)[0].tolist() == path_arrays(path_b)[0].tolist()
        assert list(path) == list(want)
    # the same forms by host, in the same order, each with the search's entry
    by_host = [f for f in forms if f[0] == "hosts"]
    assert by_host == list(plain_forms) and tried == plain_tried
    for f in by_host:
        (base, rs, lat), (want_base, want_rs, want_lat) = forms[f], plain_forms[f]
        assert lat == want_lat
        assert base.tolist() == want_base.tolist() and rs.tolist() == want_rs.tolist()
    if name in SYMMETRIC:  # a search per place form
        assert len(searched) == len(forms) - len(by_host) < len(plain_searched)
    else:
        assert searched == plain_searched and len(forms) == len(by_host)


def _oracle(row: list[int]) -> tuple[list[int], dict[int, int]]:
    """A form row with each host's places renumbered in the order first named, one
    device at a time, and where each device goes."""
    to: dict[int, int] = {}
    seen: dict[int, int] = {}
    for d in row:
        if d not in to:
            h = d // GPUS
            to[d] = h * GPUS + seen.get(h, 0)
            seen[h] = seen.get(h, 0) + 1
    return [to[d] for d in row], to


@pytest.mark.parametrize("seed", range(6))
def test_probe_renumbers_places_in_the_order_first_named(seed):
    rng = random.Random(seed)
    cluster = _clusters()["preset"]
    hops = Hops()
    step = hops.host_step(cluster)
    places = PlaceForms.of(step, hops.arrays(cluster)[1])
    assert places is not None
    t = _task(rng, rng.randint(cost.ARRAY_EDGES, 150))
    if seed % 2:  # hosts revisited out of order
        t = dataclasses.replace(t, receivers=tuple(rng.sample(t.receivers, len(t.receivers))))
    from tests.unit.test_relabeled_routes import _old_form_row

    row_bytes, _, _ = _old_form_row(t, GPUS)
    row = np.frombuffer(row_bytes, dtype=np.int64)
    key = route_key(t, 0, 0, False)
    probe = places.probe(form_key(t, key, row_bytes), row)
    want_row, want_to = _oracle(row.tolist())
    assert probe[0][5] == np.array(want_row, dtype=np.int64).tobytes()
    assert probe[0][0] == "places" and probe[0][6:] == key[6:]
    for d, to in want_to.items():
        assert probe[1][d] == to and probe[2][to] == d
    assert (probe[1] >= 0).sum() == len(want_to) == (probe[2] >= 0).sum()


def test_shared_nics_keep_the_search():
    cluster = _clusters()["two-nics"]
    hops = Hops()
    step = hops.host_step(cluster)
    assert step is not None and PlaceForms.of(step, hops.arrays(cluster)[1]) is None
    for name in SYMMETRIC:
        hops = Hops()
        c = _clusters()[name]
        assert PlaceForms.of(hops.host_step(c), hops.arrays(c)[1]) is not None


@pytest.mark.parametrize("name", SYMMETRIC)
def test_task_routes_reads_place_forms(name):
    """Through :func:`cost.task_routes` (its large tasks together): the routes are each
    task's own, twins up to places searched once a place form."""
    cluster = _clusters()[name]
    tasks = _twins(random.Random(7), 5)
    known = Routes()
    for t, (path, lat) in zip(tasks, task_routes(tasks, cluster, known)):
        want, want_lat = task_path(t, cluster, Hops())
        assert lat == want_lat and list(path) == list(want)
    assert known.hops is not None
    assert any(f[0] == "places" for f in known.hops.forms())

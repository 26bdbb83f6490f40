"""Memo keys hashed by a sample (issue 62, round nine): a large task's route key, a
chain's key and a form's key hash by a sample of their items
(:class:`sampled_keys.SampledKey`) but stay the whole tuples, so tasks that differ only
outside the sample keep routes of their own, each equal to the task's route found
alone, bit for bit."""

from __future__ import annotations

import dataclasses
import pickle
import random

import pytest

from reshard.planner.costing.cost import Hops, Routes, route_key, task_path, task_routes
from reshard.planner.costing.route_forms import chain_key, form_key
from reshard.planner.costing.route_keys import HASH_ONCE
from reshard.planner.costing.sampled_keys import SampledKey, every
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit._regular_clusters import regular_clusters

HOSTS, GPUS = 24, 8


def test_a_sampled_key_is_its_tuple():
    """Equal to the plain tuple, hashed by its sample once, and again where unpickled."""
    items = (TaskKind.BROADCAST, 3, tuple(range(100)), ())
    sample = (items[0], items[1], every(items[2], 8))
    key = SampledKey.of(items, sample)
    assert key == items and items == key and tuple(key) == items
    assert hash(key) == hash(sample)
    other = SampledKey.of((*items[:2], (*items[2][:-2], 99, 98), ()), sample)
    assert key != other  # the same sample, other items: told apart
    assert len({key: 1, other: 2}) == 2
    again = pickle.loads(pickle.dumps(key))
    assert again == key and hash(again) == hash(key) and isinstance(again, SampledKey)


def test_every_keeps_its_length_strided_items_and_last():
    assert every(tuple(range(20)), 8) == (20, (0, 8, 16), (19,))
    assert every(bytes(range(10)), 4) == (10, bytes((0, 4, 8)), bytes((9,)))
    assert every((), 8) == (0, (), ())


def _twins(rng: random.Random, k: int) -> list[Task]:
    """A large tree and tasks that differ from it only outside every key's sample:
    two receivers swapped (places 1 and 2: neither in a stride-8 sample), and one
    parent changed (place 3)."""
    picked = rng.sample(range(HOSTS * GPUS), k + 1)
    picked.sort(key=lambda d: (d // GPUS, rng.random()))
    root, receivers = picked[0], tuple(picked[1:])
    parents = tuple(rng.choice((root, *receivers[:j])) for j in range(k))
    t = Task(TaskKind.BROADCAST, 0, ((0, 8),), root, receivers, 3 << 22, 0,
             parents=parents)
    swapped = (receivers[0], receivers[2], receivers[1], *receivers[3:])
    other_parent = next(d for d in (root, *receivers[:3]) if d != parents[3])
    return [t, dataclasses.replace(t, receivers=swapped),
            dataclasses.replace(t, parents=(*parents[:3], other_parent, *parents[4:])),
            dataclasses.replace(t, parents=())]


@pytest.mark.parametrize("name", list(regular_clusters(HOSTS, GPUS)))
@pytest.mark.parametrize("seed", range(3))
def test_tasks_alike_in_the_sample_keep_their_own_routes(name, seed):
    cluster = regular_clusters(HOSTS, GPUS)[name]
    rng = random.Random(seed)
    tasks = [t for _ in range(4) for t in _twins(rng, rng.randint(HASH_ONCE, 90))]
    keys = [route_key(t, 0, 0, False) for t in tasks]
    assert all(isinstance(k, SampledKey) for k in keys)
    assert not isinstance(route_key(dataclasses.replace(tasks[0], receivers=tasks[0].receivers[
        :HASH_ONCE - 1], parents=()), 0, 0, False), SampledKey)  # fewer: the plain tuple
    assert hash(keys[0]) == hash(keys[1]) and keys[0] != keys[1]  # alike in the sample
    assert hash(chain_key(tasks[0])) == hash(chain_key(tasks[1]))
    known = Routes()
    for _ in range(2):  # found, then read back from the memo
        got = task_routes(tasks, cluster, known)
        for t, (path, lat) in zip(tasks, got):
            want, want_lat = task_path(t, cluster, Hops())
            assert lat == want_lat  # the same float
            assert list(path) == list(want)


def test_form_keys_alike_in_the_sample_stay_apart():
    t = Task(TaskKind.BROADCAST, 0, ((0, 8),), 0, tuple(range(1, 60)), 16)
    key = route_key(t, 0, 0, False)
    row = bytes(range(200))
    near = row[:1] + b"\xff" + row[2:]  # byte 1: outside a stride-24 sample
    a, b = form_key(t, key, row), form_key(t, key, near)
    assert hash(a) == hash(b) and a != b
    assert form_key(t, key, row) == a and len({a: 1, b: 2}) == 2

"""Sampled keys made together (issue 62, round eighteen): ``SampledKey.many`` and
``every_many`` against ``SampledKey.of`` and ``every`` one by one, route keys sampled
together (``route_keys``) against ``route_key``'s task by task, and the form and chain
keys (their samples made without ``every``'s call) against the samples ``every``
makes: the same tuples, samples, hashes and types."""

from __future__ import annotations

import random

import pytest

from reshard.cluster import pipeline_piece
from reshard.planner.costing.route_forms import CHAIN_STRIDE, FORM_STRIDE, chain_key, form_key
from reshard.planner.costing.route_keys import route_key, route_keys
from reshard.planner.costing.sampled_keys import SampledKey, every, every_many
from tests.unit.test_route_keys_many import _large
from tests.unit.test_route_memo import _tasks


def _same(got, want):
    assert [type(k) for k in got] == [type(k) for k in want]
    assert got == want and [tuple(k) for k in got] == [tuple(k) for k in want]
    assert [hash(k) for k in got] == [hash(k) for k in want]
    assert [getattr(k, "sample", None) for k in got] == \
        [getattr(k, "sample", None) for k in want]


@pytest.mark.parametrize("seed", range(6))
def test_many_is_of_and_every_one_by_one(seed):
    rng = random.Random(seed)
    items = [tuple(rng.randrange(50) for _ in range(rng.randrange(0, 90))) for _ in range(30)]
    items += [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 70))) for _ in range(9)]
    stride = rng.choice([1, 3, 8, 24, 32])
    assert every_many(items, stride) == [every(x, stride) for x in items]
    keys = [(i, x) for i, x in enumerate(items)]
    samples = [(i, every(x, stride)) for i, x in enumerate(items)]
    _same(SampledKey.many(keys, samples), [SampledKey.of(k, s) for k, s in zip(keys, samples)])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("piece", "per_message"), [(0, False), (1 << 16, True)])
def test_route_keys_are_route_key_s(seed, piece, per_message):
    rng = random.Random(seed)
    tasks = _tasks(rng, list(range(40)), 30) + _large(rng, 20)
    rng.shuffle(tasks)
    riders = set(rng.sample(range(len(tasks)), 7)) if per_message else set()
    want = [route_key(t, pipeline_piece(piece, t.nbytes), t.nbytes if per_message else 0,
                      i in riders) for i, t in enumerate(tasks)]
    _same(route_keys(tasks, piece, per_message, riders), want)


@pytest.mark.parametrize("seed", range(4))
def test_form_and_chain_keys_sample_as_every(seed):
    rng = random.Random(seed)
    for t in _large(rng, 12) + _tasks(rng, list(range(40)), 12):
        key = route_key(t, 0, 0, False)
        row = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        head = ("hosts", key[0], len(t.receivers), len(t.parents), len(t.addends))
        _same([form_key(t, key, row)],
              [SampledKey.of((*head, row, *key[6:]),
                             (*head, every(row, FORM_STRIDE), *key[6:]))])
        _same([chain_key(t)], [SampledKey.of((t.root, t.receivers),
                                             (t.root, every(t.receivers, CHAIN_STRIDE)))])

"""A plan's chains cut and their forms found at once (:func:`chain_cuts.cut_all`, issue
62 round eleven): each task's cut and chain equal the ones found for it alone
(:func:`chain_cuts.cut`, :func:`chain_cuts.chain_of`) on random plans of long and short
chains over a cluster with scattered device ids and uneven hosts, with relays, hosts
entered again, a device twice, twins (the same tuple, or equal copies), sends and
summing chains beside them, tasks cut before; equal forms are one object; a device the
cluster lacks is named by ``host_of``'s own error."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.cluster import ClusterError
from reshard.planner.cells import chain_cuts
from reshard.planner.cells.trees import _APPLIES, SHAPES
from reshard.planner.values.tasks import Task, TaskKind


def _cluster(rng: random.Random) -> Cluster:
    """Uneven hosts over shuffled device ids (no arithmetic rule), some ids unused."""
    ids = rng.sample(range(700), 560)
    hosts, at = [], 0
    while at < len(ids):
        n = rng.choice([1, 4, 8, 8, 8, 16])
        hosts.append(tuple(ids[at:at + n]))
        at += n
    return Cluster(tuple(hosts))


def _chain(rng: random.Random, cluster: Cluster, long: bool) -> Task:
    devices = rng.sample(cluster.devices, rng.randint(70, 300) if long else rng.randint(3, 30))
    devices.sort(key=lambda d: (cluster.host_of(d), rng.random()))  # host by host
    if rng.random() < 0.3:  # hosts entered again
        i, j = sorted(rng.sample(range(1, len(devices)), 2))
        devices[i:j] = reversed(devices[i:j])
    if rng.random() < 0.1:  # a device twice: no form
        devices.append(devices[rng.randrange(len(devices) - 1)])
    through = tuple(d for d in devices[1:-1] if rng.random() < 0.1)
    return Task(TaskKind.BROADCAST, 0, ((0, 64),), devices[0], tuple(devices[1:]), 256,
                through=through)


def _copy(items: tuple[int, ...]) -> tuple[int, ...]:
    """An equal tuple, not the same one."""
    got = (*items[:1], *items[1:])
    assert got is not items or not items
    return got


def _plan(rng: random.Random, cluster: Cluster) -> list[Task]:
    tasks = [_chain(rng, cluster, rng.random() < 0.6) for _ in range(rng.randint(3, 12))]
    for t in list(tasks):
        if rng.random() < 0.4:  # a piece of the same box: the same receivers tuple
            tasks.append(Task(t.kind, 0, ((64, 128),), t.root, t.receivers, 256,
                              through=t.through))
        if rng.random() < 0.3:  # an equal copy
            tasks.append(Task(t.kind, 0, t.box, t.root, _copy(t.receivers), 256,
                              through=_copy(t.through)))
    t = tasks[0]
    tasks.append(Task(t.kind, 0, t.box, t.root, t.receivers, 256,
                      parents=(t.root, *t.receivers[:-1])))  # never cut
    tasks.append(Task(TaskKind.SEND, 0, t.box, t.root, t.receivers[:1], 256))
    rng.shuffle(tasks)
    return tasks


def _wanted(rng: random.Random):  # type: ignore[no-untyped-def]
    return rng.choice([lambda cut: True, lambda cut: False, *_APPLIES.values()])


@pytest.mark.parametrize("seed", range(8))
def test_cut_all_is_each_chain_alone(seed):
    rng = random.Random(seed)
    cluster = _cluster(rng)
    for host in (cluster.host_of, lambda d: cluster.host_of(d)):  # arrays, one by one
        tasks = _plan(rng, cluster)
        memo: chain_cuts.Segments = {}
        for t in tasks[:3]:  # some cut before (as the search's first look does)
            if t.kind is TaskKind.BROADCAST and not t.parents:
                chain_cuts.cut(t, host, memo)
        wanted = _wanted(rng)
        chain_cuts.cut_all(tasks, host, memo, wanted)
        forms = {}
        for t in tasks:
            if t.kind is not TaskKind.BROADCAST or t.parents:
                assert id(t) not in memo
                continue
            got = memo[id(t)]
            assert got[0] is t and got[1] == chain_cuts.cut(t, host)
            assert all(type(r) is range for r in got[1])
            if wanted(got[1]):
                assert len(got) == 3
            if len(got) == 3:
                chain = got[2]  # type: ignore[misc]
                assert chain == chain_cuts.chain_of(t, host)
                assert chain.receivers is t.receivers or chain.receivers == t.receivers
                assert all(type(x) is int for part in chain.form or () for x in part)
                if chain.form is not None:
                    assert forms.setdefault(chain.form, chain.form) is chain.form  # one object
        for shape in SHAPES:  # every shape's chains then found: nothing to find again
            before = dict(memo)
            chain_cuts.cut_all(tasks, host, memo, _APPLIES[shape])
            assert all(memo[k] is v for k, v in before.items() if len(v) == 3)


@pytest.mark.parametrize("seed", range(3))
def test_devices_told_distinct_by_sets_or_one_bincount(seed, monkeypatch):
    rng = random.Random(seed)
    cluster = _cluster(rng)
    tasks = [_chain(rng, cluster, True) for _ in range(30)]
    t = tasks[0]
    tasks.append(Task(t.kind, 0, t.box, t.root, (*t.receivers, t.root), 256))  # root twice
    memo: chain_cuts.Segments = {}
    chain_cuts.cut_all(tasks, cluster.host_of, memo, lambda cut: True)
    monkeypatch.setattr(chain_cuts, "DISTINCT_BINS", -1 << 20)  # one set each
    sets: chain_cuts.Segments = {}
    chain_cuts.cut_all(tasks, cluster.host_of, sets, lambda cut: True)
    assert [memo[id(t)] for t in tasks] == [sets[id(t)] for t in tasks]
    assert {memo[id(t)][2].form is None for t in tasks} == {True, False}  # type: ignore[misc]


def test_a_device_the_cluster_lacks_is_named():
    ids = [d for d in range(90) if d != 41]  # a gap in the ids
    cluster = Cluster(tuple(tuple(ids[h * 8:h * 8 + 8]) for h in range(10)))
    ok = Task(TaskKind.BROADCAST, 0, ((0, 8),), 0, tuple(ids[1:80]), 16)
    for missing in (41, 99):
        bad = Task(TaskKind.BROADCAST, 0, ((0, 8),), 0, (*ids[1:79], missing), 16)
        with pytest.raises(ClusterError, match=f"device {missing}"):
            chain_cuts.cut_all([ok, bad], cluster.host_of, {}, lambda cut: True)
    with pytest.raises(ClusterError, match="device -1"):
        chain_cuts.cut_all([ok, Task(TaskKind.BROADCAST, 0, ((0, 8),), -1, ok.receivers, 16)],
                           cluster.host_of, {}, lambda cut: True)

"""Long chains cut alike share their cut and form (issue 62 round sixteen):
:func:`chain_cuts.cut_all` finds each pattern of segments (lengths, hosts as entered)
once among a plan's long chains (:class:`chain_cuts._Alike`). Each task's cut and
chain still equal the ones found for it alone (:func:`chain_cuts.cut`,
:func:`chain_cuts.chain_of`) on chains relabeled from one another (hosts and members
permuted), of uneven hosts, hosts entered again, a device twice, relays; chains of
one pattern share one cut and one form object, and ``treeify`` gives the tasks it
gives chain by chain."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.cells import chain_cuts, trees
from reshard.planner.cells.trees import TREE_FORMS
from reshard.planner.values.tasks import Task, TaskKind


def _cluster(rng: random.Random) -> Cluster:
    """Hosts of 8 and a few uneven ones, over shuffled ids."""
    sizes = [8] * 24 + [4, 4, 16]
    ids = rng.sample(range(2000), sum(sizes))
    hosts, at = [], 0
    for n in sizes:
        hosts.append(tuple(ids[at:at + n]))
        at += n
    return Cluster(tuple(hosts))


def _relabeled(rng: random.Random, cluster: Cluster, take: list[tuple[int, int]],
               hosts: list[tuple[int, ...]]) -> list[int]:
    """The chain of (host slot, member slot) places ``take`` over ``hosts`` (permuted
    within each host of a size, members permuted within each host)."""
    by_size: dict[int, list[tuple[int, ...]]] = {}
    for h in hosts:
        by_size.setdefault(len(h), []).append(h)
    mapped: dict[int, tuple[int, ...]] = {}
    for group in by_size.values():
        shuffled = [tuple(rng.sample(h, len(h))) for h in rng.sample(group, len(group))]
        for h, new in zip(group, shuffled):
            mapped[hosts.index(h)] = new
    return [mapped[h][m] for h, m in take]


def _plan(rng: random.Random, cluster: Cluster) -> list[Task]:
    hosts = list(cluster.hosts)
    tasks: list[Task] = []
    for _ in range(rng.randint(2, 4)):  # patterns
        slots = [(h, m) for h in range(len(hosts)) for m in range(len(hosts[h]))]
        take = rng.sample(slots, rng.randint(70, 160))
        take.sort(key=lambda s: (s[0], rng.random()))  # host by host
        if rng.random() < 0.4:  # hosts entered again
            i, j = sorted(rng.sample(range(1, len(take)), 2))
            take[i:j] = reversed(take[i:j])
        twice = rng.random() < 0.2
        relays = rng.random() < 0.3
        for k in range(rng.randint(3, 12)):  # that pattern relabeled
            chain = _relabeled(rng, cluster, take, hosts)
            if twice:
                chain.append(chain[1])  # a device twice: no form
            through = tuple(d for d in chain[1:-1] if relays and rng.random() < 0.1)
            tasks.append(Task(TaskKind.BROADCAST, 0, ((k * 8, k * 8 + 8),), chain[0],
                              tuple(chain[1:]), 64, through=through))
    rng.shuffle(tasks)
    return tasks


@pytest.mark.parametrize("seed", range(10))
def test_alike_chains_as_each_alone(seed):
    rng = random.Random(seed)
    cluster = _cluster(rng)
    tasks = _plan(rng, cluster)
    memo: chain_cuts.Segments = {}
    chain_cuts.cut_all(tasks, cluster.host_of, memo, lambda cut: True)
    cuts: dict[tuple[int, ...], list[range]] = {}
    forms: dict[object, object] = {}
    for t in tasks:
        got = memo[id(t)]
        chain = got[2]  # type: ignore[misc]
        assert got[1] == chain_cuts.cut(t, cluster.host_of)
        assert chain == chain_cuts.chain_of(t, cluster.host_of)
        assert chain.receivers is t.receivers
        lengths = tuple(map(len, got[1]))
        assert cuts.setdefault(lengths, got[1]) == got[1]
        if chain.form is not None:
            assert forms.setdefault(chain.form, chain.form) is chain.form  # one object
            assert chain.form[0] == lengths


def test_relabeled_chains_share_one_cut_and_form():
    rng = random.Random(7)
    cluster = Cluster(tuple(tuple(range(h * 8, h * 8 + 8)) for h in range(20)))
    hosts = list(cluster.hosts)
    take = [(0, 0)] + [(h, m) for h in range(1, 12) for m in range(8)]
    chains = [_relabeled(rng, cluster, take, hosts) for _ in range(9)]
    tasks = [Task(TaskKind.BROADCAST, 0, ((0, 8),), c[0], tuple(c[1:]), 64) for c in chains]
    memo: chain_cuts.Segments = {}
    chain_cuts.cut_all(tasks, cluster.host_of, memo, lambda cut: True)
    got = [memo[id(t)] for t in tasks]
    assert len({id(g[1]) for g in got}) == 1
    assert len({id(g[2].form) for g in got}) == 1  # type: ignore[misc]
    assert len({g[2].devices for g in got}) == 9  # type: ignore[misc]


@pytest.mark.parametrize("seed", range(4))
def test_treeify_of_alike_chains_as_chain_by_chain(seed):
    rng = random.Random(seed)
    cluster = _cluster(rng)
    tasks = _plan(rng, cluster)
    for shape, intra in TREE_FORMS:
        together = trees.treeify(tasks, cluster.host_of, intra, shape, {})
        alone = [u for t in tasks for u in trees.treeify(
            [t], lambda d: cluster.host_of(d), intra, shape, {})]
        assert list(together) == alone


def test_same_lengths_other_hosts_or_devices_are_told_apart():
    """Chains of equal segment lengths but hosts entered in another pattern (one
    entered again), a device twice, or only their last segment's length apart:
    each its own cut and form, as found alone."""
    cluster = Cluster(tuple(tuple(range(h * 8, h * 8 + 8)) for h in range(12)))
    segs = {  # each chain's segments as (host, members taken)
        "once": [(0, 1), (1, 3), (2, 3), (3, 3)],
        "again": [(0, 1), (1, 3), (2, 3), (1, 3)],
        "shorter": [(0, 1), (1, 3), (2, 3), (3, 2)],
    }
    base = [(4, 1), *[(5 + i, 8) for i in range(7)]]  # 57 devices: long with the rest
    tasks = []
    for name, parts in segs.items():
        used: dict[int, int] = {}
        chain = []
        for h, n in [*base, *parts]:
            at = used.get(h, 0)
            chain.extend(range(h * 8 + at, h * 8 + at + n))
            used[h] = at + n
        if name == "again":  # the plain twin of "again": a device twice instead
            twice = [*chain[:-1], chain[8]]
            tasks.append(Task(TaskKind.BROADCAST, 0, ((0, 8),), twice[0], tuple(twice[1:]), 64))
        tasks.append(Task(TaskKind.BROADCAST, 0, ((0, 8),), chain[0], tuple(chain[1:]), 64))
    memo: chain_cuts.Segments = {}
    chain_cuts.cut_all(tasks, cluster.host_of, memo, lambda cut: True)
    for t in tasks:
        assert len(t.receivers) >= chain_cuts.ARRAY_DEVICES
        assert memo[id(t)][1] == chain_cuts.cut(t, cluster.host_of)
        assert memo[id(t)][2] == chain_cuts.chain_of(t, cluster.host_of)  # type: ignore[misc]


def _short_plan(rng: random.Random, cluster: Cluster, n: int) -> list[Task]:
    """``n`` short chains (a few relabeled alike), some with relays, hosts entered
    again or a device twice, and equal copies and pieces beside them."""
    hosts = list(cluster.hosts)
    tasks: list[Task] = []
    while len(tasks) < n:
        slots = [(h, m) for h in range(len(hosts)) for m in range(len(hosts[h]))]
        take = rng.sample(slots, rng.randint(2, 40))
        take.sort(key=lambda s: (s[0], rng.random()))
        if len(take) > 3 and rng.random() < 0.3:
            i, j = sorted(rng.sample(range(1, len(take)), 2))
            take[i:j] = reversed(take[i:j])
        for _ in range(rng.randint(1, 3)):
            chain = _relabeled(rng, cluster, take, hosts)
            if rng.random() < 0.15:
                chain.append(chain[0])  # a device twice (the root)
            through = tuple(d for d in chain[1:-1] if rng.random() < 0.15)
            t = Task(TaskKind.BROADCAST, 0, ((0, 8),), chain[0], tuple(chain[1:]), 64,
                     through=through)
            tasks.append(t)
            if rng.random() < 0.3:  # a piece of its box: the same tuple
                tasks.append(Task(t.kind, 0, ((8, 16),), t.root, t.receivers, 64,
                                  through=t.through))
    tasks.append(Task(TaskKind.SEND, 0, ((0, 8),), tasks[0].root, tasks[0].receivers[:1], 64))
    rng.shuffle(tasks)
    return tasks


@pytest.mark.parametrize("seed", range(12))
def test_short_chains_cut_at_once_as_one_by_one(seed, monkeypatch):
    rng = random.Random(seed)
    cluster = _cluster(rng)
    n = [2, chain_cuts.BATCH_CHAINS - 1, chain_cuts.BATCH_CHAINS, 40][seed % 4]
    tasks = _short_plan(rng, cluster, n)
    calls: list[int] = []
    many = chain_cuts._cut_many
    monkeypatch.setattr(chain_cuts, "_cut_many",
                        lambda ts, table: calls.append(len(ts)) or many(ts, table))
    wanted = [lambda cut: True, lambda cut: False, lambda cut: len(cut) > 2][seed % 3]
    arrays: chain_cuts.Segments = {}
    alone: chain_cuts.Segments = {}
    for t in tasks[:4]:  # some cut before, as the search's first look does
        if t.kind is TaskKind.BROADCAST:
            chain_cuts.cut(t, cluster.host_of, arrays)
            chain_cuts.cut(t, cluster.host_of, alone)
    chain_cuts.cut_all(tasks, cluster.host_of, arrays, wanted)
    chain_cuts.cut_all(tasks, lambda d: cluster.host_of(d), alone, wanted)
    assert all(k >= chain_cuts.BATCH_CHAINS for k in calls)  # at once: enough of them
    if n > chain_cuts.BATCH_CHAINS + 4:  # (a few cut before, not wanted, skipped)
        assert calls
    for t in tasks:
        if t.kind is not TaskKind.BROADCAST:
            assert id(t) not in arrays
            continue
        got, one = arrays[id(t)], alone[id(t)]
        assert got[0] is t and got[1] == one[1] == chain_cuts.cut(t, cluster.host_of)
        if wanted(got[1]):
            assert len(got) == 3
        if len(got) == 3:
            assert got[2] == chain_cuts.chain_of(t, cluster.host_of)  # type: ignore[misc]
        if len(one) == 3:
            assert len(got) == 3 and got[2] == one[2]  # type: ignore[misc]

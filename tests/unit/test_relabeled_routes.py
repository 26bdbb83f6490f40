"""Routes of large tasks found once per host-renumbered form (issue 62, round six):
on a regular cluster a broadcast or reduction of many edges takes the route of an
earlier task whose hosts are a renumbering of its own (:func:`route_forms.relabeled`),
numbered back; it must equal the route the task finds alone, bit for bit, for chains,
trees, fused sums and reductions, with and without relay pieces, on one and several
NICs a host."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard import Cluster
from reshard.planner.costing import cost, relabel_many
from reshard.planner.costing.cost import Hops, Routes, task_path, task_routes
from reshard.planner.values.tasks import Task, TaskKind
from tests.unit._regular_clusters import regular_clusters

HOSTS, GPUS = 24, 8


def _clusters() -> dict[str, Cluster]:
    return regular_clusters(HOSTS, GPUS)


def _task(rng: random.Random, kind: TaskKind, k: int) -> Task:
    picked = rng.sample(range(HOSTS * GPUS), k + 1)
    if rng.random() < 0.5:  # host by host, as the planner's chains run
        picked.sort(key=lambda d: (d // GPUS, rng.random()))
    root, receivers = picked[0], tuple(picked[1:])
    parents: tuple[int, ...] = ()
    addends: tuple[int, ...] = ()
    if kind is TaskKind.BROADCAST and rng.random() < 0.5:  # a tree
        parents = tuple(rng.choice((root, *receivers[:j])) for j in range(k))
    if kind is TaskKind.BROADCAST and rng.random() < 0.3:  # a fused sum's addends
        addends = tuple(rng.sample([d for d in range(HOSTS * GPUS) if d not in picked], 5))
    return Task(kind, 0, ((0, 8),), root, receivers, rng.choice([1000, 3 << 22]), 0,
                parents=parents, addends=addends)


def _renumbered(t: Task, perm: list[int], turn: int = 0) -> Task:
    """``t`` with every device moved to host ``perm[host]``, at the same place in it
    (``turn``: that many places on, which is no twin: other devices' links)."""
    def move(ds: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(perm[d // GPUS] * GPUS + (d + turn) % GPUS for d in ds)

    return dataclasses.replace(t, root=move((t.root,))[0], receivers=move(t.receivers),
                               parents=move(t.parents), addends=move(t.addends))


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("name", list(_clusters()))
@pytest.mark.parametrize("seed", range(3))
def test_relabeled_routes_are_each_task_s_own(name, seed, batch, monkeypatch):
    """Task by task (``relabeled``, spied on) and all at once (``relabeled_many``)."""
    cluster = _clusters()[name]
    if not batch:
        monkeypatch.setattr(cost, "RELABEL_BATCH", 1 << 30)
    shared = []
    real = relabel_many.relabeled

    def spy(*args):
        before = len(args[4])  # the memo of forms
        got = real(*args)
        shared.append(len(args[4]) == before)  # nothing new in the memo: a twin's
        return got

    monkeypatch.setattr(relabel_many, "relabeled", spy)
    rng = random.Random(seed)
    known = Routes()
    tasks = []
    for _ in range(6):
        kind = rng.choice([TaskKind.BROADCAST, TaskKind.BROADCAST, TaskKind.REDUCE])
        t = _task(rng, kind, rng.randint(cost.ARRAY_EDGES, 120))
        tasks.append(t)
        for _ in range(3):  # its twins: the same task over renumbered hosts
            perm = list(range(HOSTS))
            rng.shuffle(perm)
            tasks.append(_renumbered(t, perm))
        tasks.append(_renumbered(t, list(range(HOSTS)), 1))  # same hosts, other places
    got = task_routes(tasks, cluster, known)
    for t, (path, lat) in zip(tasks, got):
        want, want_lat = task_path(t, cluster, Hops())
        assert lat == want_lat  # the same float
        assert list(path) == list(want)
    assert known.hops is not None
    hosts_forms = [f for f in known.hops.forms() if f[0] == "hosts"]  # not place forms
    assert len(hosts_forms) <= len(tasks) - len(tasks) // 2  # twins from the memo
    assert sum(shared) >= len(tasks) // 2 if not batch else shared == []


def test_devices_row_is_every_role_in_order():
    """``relabeled``'s devices read role by role equal one read over the roles' chain
    (root, receivers, parents, addends, addend parents), empty roles too."""
    import itertools

    import numpy as np

    from reshard.planner.costing.route_forms import _devices_row
    from reshard.planner.values.tasks import Task, TaskKind

    for parents, addends, addend_parents in (((), (), ()), ((0, 0, 1), (), ()),
                                             ((0, 1, 1), (17, 3), (0, 2)), ((), (9,), (1,))):
        t = Task(TaskKind.BROADCAST, 0, ((0, 4),), 5, (8, 2, 30), 16, parents=parents,
                 addends=addends, addend_parents=addend_parents)
        parts = ((t.root,), t.receivers, t.parents, t.addends, t.addend_parents)
        want = np.fromiter(itertools.chain.from_iterable(parts), dtype=np.int64)
        got = _devices_row(t)
        assert got.dtype == want.dtype and got.tolist() == want.tolist()


def _old_form_row(task: Task, devices: int):
    """The form row, hosts by rank and ranks as ``relabeled`` found them before
    (``divmod``, every role read by ``np.fromiter``)."""
    import itertools

    import numpy as np

    parts = ((task.root,), task.receivers, task.parents, task.addends, task.addend_parents)
    ds = np.fromiter(itertools.chain.from_iterable(parts), dtype=np.int64)
    hosts, place = np.divmod(ds, devices)
    runs = hosts[np.flatnonzero(hosts[1:] != hosts[:-1]) + 1].tolist()
    order = np.array(list(dict.fromkeys([int(hosts[0]), *runs])), dtype=np.int64)
    number = np.full(int(order.max()) + 1, -1, dtype=np.int64)
    number[order] = np.arange(len(order))
    return (number[hosts] * devices + place).tobytes(), order, number


@pytest.mark.parametrize("seed", range(6))
def test_host_ranks_with_and_without_chains_as_before(seed):
    """``relabeled``'s form row and host ranks, with the root and receivers' part read
    from a memo of chains (trees of one chain sharing it) and without, equal those
    found from the whole row by ``divmod``: parents in named hosts, parents in a host
    the chain does not name (read whole), addends, devices numbered from far on."""
    from reshard.planner.costing.route_forms import _host_ranks

    rng = random.Random(seed)
    devices = rng.choice([1, 4, 8, 6])
    chains: dict = {}
    for _ in range(30):
        base = rng.choice([0, 4096])
        picked = [base + d for d in rng.sample(range(200), rng.randint(2, 60))]
        if rng.random() < 0.6:  # host by host
            picked.sort(key=lambda d: (d // devices, rng.random()))
        root, receivers = picked[0], tuple(picked[1:])
        for _ in range(3):  # trees of one chain
            parents: tuple[int, ...] = ()
            addends: tuple[int, ...] = ()
            if rng.random() < 0.7:
                parents = tuple(rng.choice((root, *receivers[:j]))
                                for j in range(len(receivers)))
            named = {d // devices for d in picked}
            free = [base + d for d in range(250) if (base + d) // devices not in named]
            if parents and rng.random() < 0.3:  # a parent in a host not named
                parents = (*parents[:-1], rng.choice(free))
            if rng.random() < 0.15:
                addends = (base + 300 + rng.randrange(50),)
            t = Task(TaskKind.BROADCAST, 0, ((0, 8),), root, receivers, 16,
                     parents=parents, addends=addends,
                     addend_parents=(root,) * len(addends))
            want_row, want_order, want_number = _old_form_row(t, devices)
            for memo in (None, chains):
                row, order, number = _host_ranks(t, devices, memo)
                assert row == want_row
                assert order.tolist() == want_order.tolist()
                assert number.tolist() == want_number.tolist()
    assert chains  # the memo was used


@pytest.mark.parametrize("seed", range(8))
def test_first_named_is_dict_order(seed):
    """The hosts in the order first met, by a table of first places (round ten), equal
    ``dict.fromkeys``' order: runs of repeats, far hosts, and negative ones (a dict)."""
    import numpy as np

    from reshard.planner.costing.route_forms import _first_named

    rng = random.Random(seed)
    for _ in range(40):
        low = -3 if seed % 4 == 0 else 0
        runs = [rng.randrange(low, rng.choice([5, 130, 5000])) for _ in range(rng.randint(1, 300))]
        got = _first_named(np.array(runs, dtype=np.int64))
        assert got.dtype == np.int64
        assert got.tolist() == list(dict.fromkeys(runs))


@pytest.mark.parametrize("seed", range(6))
def test_a_parent_off_the_chain_s_hosts_reads_the_whole_row(seed):
    """A tree whose parent lies in a host its chain does not name, below host 0 or past
    the last named host is ranked from its whole row (round ten's one ``take``)."""
    import numpy as np

    from reshard.planner.costing.route_forms import _host_ranks

    rng = random.Random(seed)
    devices = rng.choice([4, 8])
    chains: dict = {}
    for _ in range(20):
        picked = rng.sample(range(8 * devices, 40 * devices), rng.randint(3, 40))
        root, receivers = picked[0], tuple(picked[1:])
        named = sorted({d // devices for d in picked})
        odd = rng.choice([-1, -devices - 1, named[0] * devices - 1, 0,
                          (named[-1] + 1) * devices, (named[-1] + 7) * devices + 3,
                          *(h * devices for h in range(named[0], named[-1]) if h not in named)])
        parents = tuple(rng.choice((root, *receivers[:j])) for j in range(len(receivers)))
        for p in (parents, (*parents[:-1], odd)):
            t = Task(TaskKind.BROADCAST, 0, ((0, 8),), root, receivers, 16, parents=p)
            got = _host_ranks(t, devices, chains)
            want = _host_ranks(t, devices, None)  # the whole row, no chain read
            assert got[0] == want[0]
            assert np.array_equal(got[1], want[1]) and np.array_equal(got[2], want[2])
            if min(p) >= 0:
                assert got[0] == _old_form_row(t, devices)[0]


def test_relabeled_routes_share_read_only_fractions():
    """Routes numbered back from one form share one read-only array of fractions (each
    1.0): none is written, and no route pays for its own."""
    import numpy as np

    from reshard.planner.costing.fairshare import path_arrays

    cluster = _clusters()[next(iter(_clusters()))]
    rng = random.Random(3)
    t = _task(rng, TaskKind.BROADCAST, 80)
    twins = [t]
    for _ in range(4):
        perm = list(range(HOSTS))
        rng.shuffle(perm)
        twins.append(_renumbered(t, perm))
    got = task_routes(twins, cluster, Routes())
    fracs = [path_arrays(p)[1] for p, _ in got[1:]]
    assert all(f is fracs[0] for f in fracs)
    assert not fracs[0].flags.writeable and np.array_equal(fracs[0], np.ones(len(fracs[0])))


@pytest.mark.parametrize("seed", range(4))
def test_a_tree_of_a_known_chain_reads_its_parents_alone(seed, monkeypatch):
    """Once its chain is known, a tree whose parents lie in the chain's hosts is ranked
    from the chain's part and its parents alone (no whole row), and the same row."""
    from reshard.planner.costing import route_forms

    rng = random.Random(seed)
    devices = 8
    chains: dict = {}
    whole = []
    real = route_forms._ranked_row
    monkeypatch.setattr(route_forms, "_ranked_row",
                        lambda *a: whole.append(1) or real(*a))  # type: ignore[func-returns-value]
    for _ in range(10):
        first = rng.randrange(0, 30)
        picked = rng.sample(range(first * devices, (first + 6) * devices), 30)
        root, receivers = picked[0], tuple(picked[1:])
        chain = Task(TaskKind.BROADCAST, 0, ((0, 8),), root, receivers, 16)
        route_forms._host_ranks(chain, devices, chains)  # the chain, found once
        parents = tuple(rng.choice((root, *receivers[:j])) for j in range(len(receivers)))
        t = dataclasses.replace(chain, parents=parents)
        before = len(whole)
        got = route_forms._host_ranks(t, devices, chains)
        assert len(whole) == before  # no whole row read
        assert got[0] == route_forms._host_ranks(t, devices, None)[0]

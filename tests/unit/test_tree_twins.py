"""A tree form passing on as a chain is the star form's plan where no reshaped chain
has two members in a host (:func:`reshard.planner.passes.tree_twins.same_as_star`):
the search takes the star form's tasks instead of building them again (issue 62,
round seven). Checked against ``treeify`` itself on random plans (short and long
chains, relay-only devices, hosts entered twice, sends and summing tasks beside
them), and the search's plans with the shortcut against the plans without it."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.cells import trees
from reshard.planner.cells.trees import HostShape, Intra, treeify
from reshard.planner.passes import stages
from reshard.planner.passes.tree_twins import same_as_star
from reshard.planner.plan import plan_many
from reshard.planner.values.tasks import Task, TaskKind

GPUS, HOSTS = 8, 40


def _host(d: int) -> int:
    return d // GPUS


def _chain(rng: random.Random, most: int) -> Task:
    """A chain over random hosts, each entered with 1 to ``most`` devices."""
    hosts = rng.sample(range(HOSTS), rng.randint(2, 12 if rng.random() < 0.8 else 30))
    devices: list[int] = []
    for h in hosts:
        devices += rng.sample(range(h * GPUS, h * GPUS + GPUS), rng.randint(1, most))
    if rng.random() < 0.2:  # enter the first remote host again
        again = [d for d in range(hosts[1] * GPUS, hosts[1] * GPUS + GPUS)
                 if d not in devices]
        devices += again[:1]
    root, receivers = devices[0], tuple(devices[1:])
    through = tuple(d for d in receivers[:-1] if rng.random() < 0.15)
    return Task(TaskKind.BROADCAST, 0, ((0, 256),), root, receivers, 1 << 20,
                through=through)


def _plan(rng: random.Random) -> list[Task]:
    most = rng.choice((1, 2, 3, 8))  # devices a host is entered with, at most
    tasks = [_chain(rng, most if rng.random() < 0.9 else 1) for _ in range(rng.randint(1, 6))]
    tasks.append(Task(TaskKind.SEND, 0, ((0, 256),), 0, (GPUS,), 1 << 20))
    t = tasks[0]  # a summing chain (parents set) is never reshaped
    tasks.append(Task(t.kind, 0, t.box, t.root, t.receivers, t.nbytes,
                      parents=(t.root, *t.receivers[:-1])))
    rng.shuffle(tasks)
    return tasks


@pytest.mark.parametrize("shape", [HostShape.DOUBLE, HostShape.STAR])
def test_the_chain_form_is_the_star_form_where_said(shape):
    rng = random.Random(7)
    said = {True: 0, False: 0}
    differ = 0
    for _ in range(300):
        tasks = _plan(rng)
        memo: trees.Segments = {}
        star = treeify(tasks, _host, Intra.STAR, shape, memo)
        chain = treeify(tasks, _host, Intra.CHAIN, shape, {})
        same = same_as_star(tasks, _host, shape, memo)
        said[same] += 1
        if same:
            assert chain == star
        differ += chain != star
    assert said[True] >= 50 and said[False] >= 50  # both answers exercised
    assert differ >= 30  # and the forms really differ where it says no


def test_a_chain_missing_from_the_memo_is_unknown():
    rng = random.Random(3)
    tasks = [_chain(rng, 1) for _ in range(3)]
    memo: trees.Segments = {}
    treeify(tasks[:2], _host, Intra.STAR, HostShape.DOUBLE, memo)
    assert not same_as_star(tasks, _host, HostShape.DOUBLE, memo)
    treeify(tasks, _host, Intra.STAR, HostShape.DOUBLE, memo)
    assert same_as_star(tasks, _host, HostShape.DOUBLE, memo)


_REQUESTS = [("S0R", "RS1"), ("RS0", "S1R"), ("S10R", "RR"), ("S1R", "S1R"),
             ("RR+P0", "RS0"), ("S0R+P1", "RR")]


@pytest.mark.parametrize("shape", [(2048, 2048), (1024, 4096)])
def test_the_search_plans_the_same_with_and_without_the_shortcut(shape, monkeypatch):
    cluster = Cluster.preset("dgx-h100", 8)
    a, b = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))

    def plans() -> list[tuple[bytes, float]]:
        out = []
        for src, dst in _REQUESTS:
            p = plan_many([(shape, "bfloat16", Layout(a, src), Layout(b, dst))], cluster)
            out.append((p.digest(), p.estimate()))
        return out

    taken = []
    real = stages.same_as_star

    def counted(*args: object) -> bool:
        got = real(*args)  # type: ignore[arg-type]
        taken.append(got)
        return got

    monkeypatch.setattr(stages, "same_as_star", counted)
    fast = plans()
    assert any(taken)  # the shortcut was taken
    monkeypatch.setattr(stages, "same_as_star", lambda *args: False)
    assert plans() == fast

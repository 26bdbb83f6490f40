"""Trees of short chains found once per form too (issue 62, round ten: trees.FORM_MEMBERS):
a chain of a few receivers (fewer than trees.ARRAY_MEMBERS, its hosts read one by one)
gets from its form the trees trees._trees_of lays out for the chain itself, for every
host shape and way of passing on, with relays, hosts entered twice, one receiver on a
host and renumbered copies (hosts and devices moved); and treeify of a plan's chains
gives the same tasks with forms as chain by chain."""

from __future__ import annotations

import random

import pytest

from reshard.planner.cells import chain_cuts, trees
from reshard.planner.cells.trees import SHAPES, Intra
from reshard.planner.values.tasks import Task, TaskKind

GPUS, HOSTS = 8, 12


def _host(d: int) -> int:
    return d // GPUS


def _chain(rng: random.Random, root_host: int = 0) -> Task:
    """A chain from a root on ``root_host`` to a few receivers, host by host (some
    hosts with one receiver); sometimes a host entered twice, some relays."""
    hosts = rng.sample([h for h in range(HOSTS) if h != root_host], rng.randint(1, 6))
    receivers = []
    for h in hosts:
        receivers += rng.sample(range(h * GPUS, h * GPUS + GPUS), rng.choice([1, 2, 3, 8]))
    if rng.random() < 0.3 and len(receivers) > 3:  # enter a host twice
        i, j = sorted(rng.sample(range(1, len(receivers)), 2))
        receivers[i:j] = reversed(receivers[i:j])
    root = root_host * GPUS + rng.randrange(GPUS)
    through = tuple(d for d in receivers[:-1] if rng.random() < 0.15)
    return Task(TaskKind.BROADCAST, 0, ((0, 64), (0, 8)), root, tuple(receivers), 1 << 14,
                through=through)


def _moved(t: Task, perm: list[int], turn: int) -> Task:
    def move(d: int) -> int:
        return perm[_host(d)] * GPUS + (d + turn) % GPUS

    return Task(t.kind, t.tensor, t.box, move(t.root), tuple(map(move, t.receivers)),
                t.nbytes, through=tuple(map(move, t.through)))


@pytest.mark.parametrize("seed", range(6))
def test_short_trees_by_form_are_the_chain_s_own(seed):
    rng = random.Random(seed)
    chains = []
    for _ in range(8):
        t = _chain(rng)
        chains.append(t)
        for turn in (0, 5):
            perm = list(range(HOSTS))
            rng.shuffle(perm)
            chains.append(_moved(t, perm, turn))
        chains.append(Task(t.kind, t.tensor, t.box, t.root, t.receivers, t.nbytes))
    assert all(len(t.receivers) < chain_cuts.ARRAY_DEVICES for t in chains)
    memo: trees.Segments = {}
    chain_cuts.cut_all(chains, _host, memo, lambda cut: True)  # equal forms made one
    for shape in SHAPES:
        for intra in Intra:
            forms: trees.TreeForms = {}
            for t in chains:
                want = trees._trees_of(t, _host, intra, shape)
                chain = memo[id(t)][2]  # type: ignore[misc]
                assert chain == chain_cuts.chain_of(t, _host) and chain.form is not None
                assert trees._trees_by_form(chain, intra, shape, forms) == want
                alone: trees.TreeForms = {}
                assert trees._trees_by_form(chain_cuts.chain_of(t, _host), intra, shape,
                                            alone) == want
            assert len(forms) < len(chains)  # copies found from their form


@pytest.mark.parametrize("seed", range(4))
def test_treeify_with_short_forms_is_chain_by_chain(seed, monkeypatch):
    """A plan's tasks (chains repeating a few forms, sends and devices met twice among
    them) reshaped for every tree form, the short chains' trees from their forms or
    chain by chain: the same tasks."""
    rng = random.Random(seed)
    base = [_chain(rng, root_host=rng.randrange(2)) for _ in range(6)]
    tasks = []
    for k in range(60):
        t = base[k % len(base)]
        perm = list(range(HOSTS))
        if k % 3:
            perm[2:] = rng.sample(perm[2:], HOSTS - 2)  # the root's host kept
        tasks.append(_moved(t, perm, rng.randrange(GPUS)))
        if k % 7 == 0:
            tasks.append(Task(TaskKind.SEND, 0, t.box, t.root, t.receivers[:1], t.nbytes))
    t = tasks[0]
    tasks.append(Task(t.kind, t.tensor, t.box, t.root, (*t.receivers, t.receivers[0]),
                      t.nbytes))  # a device twice: no form
    for shape in SHAPES:
        for intra in Intra:
            got = trees.treeify(tasks, _host, intra, shape, {})
            with monkeypatch.context() as m:
                m.setattr(trees, "FORM_MEMBERS", 1 << 30)
                assert trees.treeify(tasks, _host, intra, shape, {}) == got

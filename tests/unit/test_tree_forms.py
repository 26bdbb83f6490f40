"""Trees of long chains found once per form (issue 62, round six): a chain's trees
found from its form (:func:`trees._trees_by_form`: its places, its segments' lengths
and hosts in the order it enters them, its relay-only places) and numbered back equal
the trees :func:`trees._trees_of` lays out for the chain itself, for every host shape
and way of passing on, with relays, hosts entered twice and chains that are
renumbered copies of each other (whose forms come from the memo)."""

from __future__ import annotations

import random

import pytest

from reshard.planner.cells import chain_cuts, trees
from reshard.planner.cells.trees import SHAPES, Intra
from reshard.planner.values.tasks import Task, TaskKind

GPUS, HOSTS = 8, 100


def _host(d: int) -> int:
    return d // GPUS


def _chain(rng: random.Random) -> Task:
    devices = rng.sample(range(GPUS * HOSTS), rng.randint(chain_cuts.ARRAY_DEVICES + 1, 120))
    devices.sort(key=lambda d: (_host(d), rng.random()))  # host by host, as planned
    if rng.random() < 0.5:  # enter a host twice
        i, j = sorted(rng.sample(range(1, len(devices)), 2))
        devices[i:j] = reversed(devices[i:j])
    root, receivers = devices[0], tuple(devices[1:])
    through = tuple(d for d in receivers[:-1] if rng.random() < 0.2)
    return Task(TaskKind.BROADCAST, 0, ((0, 64),), root, receivers, 1 << 20,
                through=through)


def _moved(t: Task, perm: list[int], turn: int) -> Task:
    """``t`` over hosts renumbered by ``perm``, each device ``turn`` places on in its
    host."""
    def move(d: int) -> int:
        return perm[_host(d)] * GPUS + (d + turn) % GPUS

    return Task(t.kind, t.tensor, t.box, move(t.root), tuple(map(move, t.receivers)),
                t.nbytes, through=tuple(map(move, t.through)))


@pytest.mark.parametrize("seed", range(4))
def test_trees_by_form_are_the_chain_s_own(seed):
    rng = random.Random(seed)
    chains = []
    for _ in range(5):
        t = _chain(rng)
        chains.append(t)
        for turn in (0, 3):
            perm = list(range(HOSTS))
            rng.shuffle(perm)
            chains.append(_moved(t, perm, turn))
        # the same chain with other relays, and with one more segment over a new host
        # or an old one: other forms
        chains.append(Task(t.kind, t.tensor, t.box, t.root, t.receivers, t.nbytes,
                           through=t.receivers[:-1:3]))
        used = {_host(d) for d in (t.root, *t.receivers)}
        fresh = next(h for h in range(HOSTS) if h not in used) * GPUS
        # a host the chain left, entered again (two of its segments share the host)
        left = next(_host(d) for d in t.receivers if _host(d) != _host(t.root))
        again = [d for d in range(left * GPUS, left * GPUS + GPUS)
                 if d not in (t.root, *t.receivers)]
        for last in (fresh, *again[:1]):  # one more host, or one entered again
            chains.append(Task(t.kind, t.tensor, t.box, t.root, (*t.receivers, last),
                               t.nbytes, through=t.through))
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
            assert len(forms) <= 20  # each chain's copies found from its form


@pytest.mark.parametrize("seed", range(4))
def test_chain_forms_kept_with_segments_are_each_chain_s_own(seed):
    """Every tree form of a plan reads a chain's form from the memo of segments (found
    once per task, as ``treeify`` passes it from the stage search): each form's trees
    still equal the chain's own, for chains that differ only in their relays, devices
    met twice, and the form kept equals the one found without a memo."""
    rng = random.Random(seed)
    chains = []
    for _ in range(6):
        t = _chain(rng)
        chains += [t, Task(t.kind, t.tensor, t.box, t.root, t.receivers, t.nbytes,
                           through=t.receivers[1:-1:2])]
    t = chains[0]
    chains.append(Task(t.kind, t.tensor, t.box, t.root, (*t.receivers, t.receivers[3]),
                       t.nbytes))  # a device twice: no form
    memo: trees.Segments = {}
    for shape in SHAPES:
        for intra in Intra:
            got = trees.treeify(chains, _host, intra, shape, memo)
            assert got == trees.treeify(chains, _host, intra, shape)  # without a memo
            want = []
            for t in chains:
                want += trees._reshape(t, _host, intra, shape) \
                    if trees._applies(t, _host, shape) else [t]
            assert got == tuple(want)
    for t in chains:
        assert len(memo[id(t)]) == 3  # its form kept beside its segments
        assert memo[id(t)][2] == chain_cuts.chain_of(t, _host)

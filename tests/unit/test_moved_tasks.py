"""new_tasks.moved_task (a chain's halves built slot by slot, issue 62 round seventeen)
against ``dataclasses.replace``, and cell_tasks.fan_out, which builds its halves with
it, against the same cut built by ``dataclasses.replace``: equal tasks field by field,
hashes and reprs included, on chains with relays, trees' parents, fused sums' addends,
pieces and every kind and source."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard.planner.cells.cell_tasks import fan_out
from reshard.planner.cells.new_tasks import TASK_FIELDS, moved_task
from reshard.planner.values.tasks import Buffer, Task, TaskKind

GPUS = 4  # devices per host in these cases: host(d) = d // GPUS


def _same(got: list[Task], want: list[Task]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert type(g) is Task
        assert g == w and hash(g) == hash(w) and repr(g) == repr(w)
        for name in TASK_FIELDS:
            assert getattr(g, name) == getattr(w, name), name


def _task(rng: random.Random) -> Task:
    box = tuple((a, a + rng.randrange(1, 9)) for a in range(rng.randrange(1, 4)))
    root = rng.randrange(24)
    hosts = rng.sample(range(24 // GPUS), rng.randrange(1, 4))  # the chain host by host
    chain = tuple(d for h in hosts for d in rng.sample(range(h * GPUS, h * GPUS + GPUS),
                                                       rng.randrange(1, GPUS))
                  if d != root) or ((root + 1) % 24,)
    extra: dict[str, object] = {}
    if rng.random() < 0.3 and len(chain) > 1:  # relay-only devices: never the chain's last
        extra["through"] = tuple(rng.sample(chain[:-1], rng.randrange(1, min(3, len(chain)))))
    if rng.random() < 0.15:
        extra["source"] = Buffer.DST
    if rng.random() < 0.1:
        extra["pieces"] = (box, box)
    if rng.random() < 0.1:
        extra["parents"] = (root, *chain[:-1])
    if rng.random() < 0.1:
        extra["addends"] = tuple(rng.sample(range(24, 32), 2))
    kind = rng.choice([TaskKind.BROADCAST] * 4 + [TaskKind.SEND, TaskKind.COPY])
    return Task(kind, rng.randrange(3), box, root, chain, rng.randrange(1, 10**6),
                rng.randrange(4), **extra)


def _fan_out_by_replace(tasks: list[Task], host) -> list[Task]:
    """fan_out's cut, each half built by dataclasses.replace (as before this round)."""
    out: list[Task] = []
    for t in tasks:
        chain = t.receivers
        if t.kind is not TaskKind.BROADCAST or t.source is not Buffer.SRC or t.parents:
            out.append(t)
            continue
        last = host(chain[-1])
        i = len(chain)
        while i > 0 and host(chain[i - 1]) == last:
            i -= 1
        while chain[i] in t.through:
            i += 1
        if host(t.root) == last or i + 2 > len(chain):
            out.append(t)
            continue
        head, tail = chain[:i + 1], chain[i + 1:]
        through = tuple(d for d in t.through if d in head)
        out.append(dataclasses.replace(t, kind=TaskKind.BROADCAST if len(head) > 1
                                       else TaskKind.SEND, receivers=head, through=through))
        out.append(dataclasses.replace(t, kind=TaskKind.BROADCAST if len(tail) > 1
                                       else TaskKind.SEND, root=chain[i], receivers=tail,
                                       through=(), step=t.step + 1, source=Buffer.DST))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_moved_task_is_replace_s_task(seed):
    rng = random.Random(seed)
    for _ in range(300):
        t = _task(rng)
        kind = rng.choice(list(TaskKind))
        root = rng.randrange(-1, 24)
        receivers = tuple(rng.sample(range(24), rng.randrange(1, 5)))
        through = tuple(rng.sample(receivers, rng.randrange(len(receivers) + 1)))
        step, source = rng.randrange(5), rng.choice(list(Buffer))
        want = dataclasses.replace(t, kind=kind, root=root, receivers=receivers,
                                   through=through, step=step, source=source)
        _same([moved_task(t, kind, root, receivers, through, step, source)], [want])


@pytest.mark.parametrize("seed", range(6))
def test_fan_out_is_the_cut_built_by_replace(seed):
    rng = random.Random(seed)
    def host(d):
        return d // GPUS
    cut = 0
    for _ in range(60):
        tasks = [_task(rng) for _ in range(rng.randrange(1, 6))]
        want = _fan_out_by_replace(tasks, host)
        _same(fan_out(tasks, host), want)
        cut += len(want) - len(tasks)
    assert cut > 20  # many chains were cut in two (the halves built, not only kept)

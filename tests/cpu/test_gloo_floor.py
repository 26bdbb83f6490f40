"""The bare-gloo replay of a plan's messages (:mod:`reshard.microbench.gloo_floor`)."""

from __future__ import annotations

import time

import pytest

from reshard import Cluster, DeviceMesh, Layout, plan
from reshard.microbench import gloo_floor
from reshard.planner.values.tasks import Task, TaskKind

pytestmark = pytest.mark.cpu


def _plan(dst_devices: list[int], strategy: str = "broadcast"):
    cl = Cluster.regular(1, 1 + len(dst_devices))
    src = Layout(DeviceMesh((1, 1), [0]), "RR")
    dst = Layout(DeviceMesh((1, len(dst_devices)), dst_devices), "RR")
    return plan((64, 32), "float32", src, dst, cluster=cl, strategy=strategy)


def test_a_plans_messages_are_its_tasks_edges_by_step():
    p = _plan([1, 2, 3])
    steps = gloo_floor.plan_steps(p.tasks)
    want: dict[int, list] = {}
    for t in p.tasks:
        want.setdefault(t.step, []).extend((a, b, t.nbytes) for a, b in t.edges())
    assert steps == tuple(tuple(want[s]) for s in sorted(want))
    # every receiver gets every byte of the tensor once
    into: dict[int, int] = {}
    for step in steps:
        for _, b, n in step:
            into[b] = into.get(b, 0) + n
    assert into == {1: 64 * 32 * 4, 2: 64 * 32 * 4, 3: 64 * 32 * 4}


def test_copies_send_nothing_reductions_chain_into_their_root_allgathers_refused():
    box = ((0, 4),)
    assert gloo_floor.task_edges(Task(TaskKind.COPY, 0, box, 2, (2,), 16, 0)) == []
    red = Task(TaskKind.REDUCE, 0, box, 0, (3, 1), 16, 0)
    assert gloo_floor.task_edges(red) == [(3, 1, 16), (1, 0, 16)]
    with pytest.raises(ValueError, match="all-gather"):
        gloo_floor.task_edges(Task(TaskKind.ALLGATHER, 0, box, 0, (0, 1), 16, 0))
    with pytest.raises(ValueError, match="all-reduce"):
        gloo_floor.task_edges(Task(TaskKind.ALLREDUCE, 0, box, -1, (0, 1), 16, 0))


def test_coalesced_messages_replay_once_with_their_tasks_bytes():
    from reshard.microbench.small_tensors import requests
    from reshard.planner.plan import plan_many
    from reshard.planner.schedule.coalesce import followers

    p = plan_many(requests(40), Cluster.regular(2, 4))
    skip = followers(p.tasks, p.tensors)
    assert skip  # some tasks do travel in others' messages
    alone, merged = gloo_floor.plan_steps(p.tasks), gloo_floor.coalesced_steps(p.tasks,
                                                                               p.tensors)
    # the same bytes cross every (sender, receiver) pair, in fewer messages
    def per_pair(steps):
        out: dict[tuple[int, int], int] = {}
        for step in steps:
            for a, b, n in step:
                out[(a, b)] = out.get((a, b), 0) + n
        return out

    assert per_pair(merged) == per_pair(alone)
    assert sum(map(len, merged)) == sum(map(len, alone)) - sum(
        len(p.tasks[i].edges()) for i in skip)


def test_a_box_is_contiguous_when_it_is_whole_rows_or_part_of_one():
    full = ((0, 4), (0, 8))
    assert gloo_floor.contiguous(((1, 3), (0, 8)), full)
    assert gloo_floor.contiguous(((2, 3), (2, 6)), full)
    assert not gloo_floor.contiguous(((1, 3), (0, 4)), full)
    cube = ((0, 2), (0, 3), (0, 4))
    assert gloo_floor.contiguous(((1, 2), (1, 3), (0, 4)), cube)
    assert not gloo_floor.contiguous(((0, 2), (1, 3), (0, 4)), cube)
    assert gloo_floor.contiguous(((0, 1), (0, 1), (0, 2)), cube)  # part of one row
    assert gloo_floor.contiguous(((0, 2), (0, 3), (0, 4)), cube)  # all of it


def test_only_strided_boxes_are_copied():
    # rows split -> columns split: each box is half of its source shard's rows (strided
    # there: a root packs it) and whole rows of its destination shard (lands in place)
    from reshard.planner.plan import plan_many

    a, b = DeviceMesh((1, 2), [0, 1]), DeviceMesh((1, 2), [2, 3])
    for src, dst, packs in (("S1R", "RS1", True), ("RS1", "S1R", False)):
        p = plan_many([((64, 64), "float32", Layout(a, src), Layout(b, dst))],
                      Cluster.regular(2, 2))
        steps = gloo_floor.plan_steps(p.tasks)
        copies = gloo_floor.strided_copies(p.tasks, p.tensors, coalesced=False)
        assert [len(s) for s in copies] == [len(s) for s in steps]
        for step, cs in zip(steps, copies):
            for (_, _, n), (pack, unpack) in zip(step, cs):
                assert (pack, unpack) == ((n, 0) if packs else (0, n))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", sorted(gloo_floor.TRANSPORTS))
def test_a_plan_replays_over_each_transport(transport):
    # a chain 0 -> 1 -> 2 and a second step back from 2 to 0: both directions of
    # connections, a relay, two steps, two messages on one connection, an empty one
    p = _plan([1, 2])
    steps = (*gloo_floor.plan_steps(p.tasks), ((2, 0, 1000), (2, 0, 24), (1, 2, 0)))
    rows = [gloo_floor.Row("tiny", 64 * 32 * 4, 3, steps, p.lower_bound())]
    (seconds,) = gloo_floor.floors(rows, rounds=3, repeats=1, transport=transport)
    assert 0 < seconds < 10


@pytest.mark.timeout(120)
def test_a_failing_or_stuck_replay_fails_instead_of_hanging():
    # rank 3 is outside the world of 3: the sockets replay has no port for it (its
    # sender fails at once); gloo waits for ever on it (the call's timeout ends it, or,
    # as the processes are stopped, a peer's broken connection is reported first; under
    # load gloo has also been seen to end a process without a Python error)
    rows = [gloo_floor.Row("bad", 16, 3, (((0, 3, 16),),), 1e-6)]
    with pytest.raises(RuntimeError, match="sockets processes failed: rank 0: IndexError"):
        gloo_floor.floors(rows, rounds=1, repeats=1, transport="sockets")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"gloo processes failed: (3 not done after 15 s|"
                                           r"rank \d: RuntimeError: .*Connection reset|"
                                           r"rank \d died without a word \(exit code -?\d+\))"):
        gloo_floor.floors(rows, rounds=1, repeats=1, transport="gloo", timeout=15)
    assert time.monotonic() - t0 < 60


def _testbed_available():
    from reshard.testbed import available

    return available()


@pytest.mark.netns
@pytest.mark.timeout(240)
def test_a_replay_on_the_testbed_goes_through_its_shaped_nics():
    avail = _testbed_available()
    if not avail:
        pytest.skip(f"no netns testbed: {avail.reason}")
    from reshard.testbed import Testbed

    nbytes = 1 << 20
    rows = [gloo_floor.Row("1 MiB across", nbytes, 2, (((0, 1, nbytes),),), 1e-3)]
    with Testbed(2, 1.0) as tb:
        places = tb.netns_placement().hosts
        wire = nbytes / tb.payload_bandwidth  # 8.8 ms at 1 Gbit/s; loopback: ~0.3 ms
        for transport in sorted(gloo_floor.TRANSPORTS):
            (seconds,) = gloo_floor.floors(rows, rounds=3, repeats=1, transport=transport,
                                           places=places)
            assert 0.9 * wire < seconds < 20 * wire, transport


@pytest.mark.parametrize("argv, says", [
    (["-n", "0"], "expected an integer >= 1"),
    (["-b", "1Q"], "bad size '1Q'"),
    (["-b", "1M,,8M"], "bad size ''"),
    (["--cases", "nine"], "no paper case named nine"),
])
def test_bad_flags_are_usage_errors_before_anything_runs(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        gloo_floor.main(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err

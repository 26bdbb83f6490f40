"""Scale-out: every device's program cut in one pass, and SPMD planning (every rank plans
for itself, the ranks compare digests before any byte moves), on the in-process
reference backend (one thread per rank)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.comm.backends.local import LocalBackend, LocalFabric
from reshard.comm.executor import Executor
from reshard.comm.program import WorkerProgram, programs

from ..common import addends, sample

CLUSTER = Cluster.regular(2, 4)
SRC = Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "S0S1")
DST = Layout(DeviceMesh((4,), [4, 5, 6, 7]), "RS0")
PARTIAL = Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "S0R+P1")
RR = Layout(DeviceMesh((4,), [4, 5, 6, 7]), "RR")


def _plan():
    return reshard.plan_many([((64, 48), "float32", SRC, DST), ((10, 6), "int32", PARTIAL, DST)],
                             cluster=CLUSTER)


def test_programs_in_one_pass_equal_the_devices_slices():
    plan = _plan()
    every = programs(plan)
    assert set(every) == set(plan.devices)
    for d, prog in every.items():
        assert [i for i, _ in prog.tasks] == [i for i, t in enumerate(plan.tasks)
                                             if d in t.devices]
        assert prog == WorkerProgram.of(plan, d)
        assert prog.groups == plan.communicator_groups()
    # every task lands in each of its devices' lists once, nowhere else
    landed = sorted((i, d) for d, p in every.items() for i, _ in p.tasks)
    assert landed == sorted((i, d) for i, t in enumerate(plan.tasks) for d in set(t.devices))


def test_programs_name_only_their_own_member_sets_unless_the_world_creates_them():
    plan = _plan()
    own = programs(plan, all_groups=False)
    everything = plan.communicator_groups()
    assert any(len(p.groups) < len(everything) for p in own.values())
    for d, prog in own.items():
        assert prog.groups == tuple(g for g in everything if d in g)  # first-use order kept
        assert WorkerProgram.from_json(prog.to_json()) == prog
    outside = programs(plan, [99], all_groups=False)[99]
    assert outside.tasks == () and outside.groups == ()


def test_programs_pickle_to_equal_programs():
    """A program pickles (how a launcher ships it) to an equal program, for every kind
    of task: fused partial sums with addends, all-gathers with pieces, broadcasts, a
    relay through a device that keeps nothing; a worker checks what it unpickles."""
    import pickle
    from dataclasses import replace

    fused = Layout(DeviceMesh((2, 2), [4, 5, 6, 7]), "RS0")  # the partial sums fuse
    plans = [_plan(), reshard.plan((64, 64), "float32", PARTIAL, fused, cluster=CLUSTER),
             *(reshard.plan_many([((64, 48), "float32", SRC, RR)], cluster=CLUSTER, strategy=s)
               for s in ("allgather", "broadcast", "send_recv"))]
    tasks = [t for p in plans for t in p.tasks]
    assert any(t.addends for t in tasks) and any(t.pieces for t in tasks)
    for plan in plans:
        for prog in programs(plan).values():
            assert pickle.loads(pickle.dumps(prog, pickle.HIGHEST_PROTOCOL)) == prog
    chain = next(t for t in plans[3].tasks if len(t.receivers) > 1 and not t.addends)
    relayed = WorkerProgram(chain.root, (), ((0, replace(chain, through=chain.receivers[:1])),),
                            ())
    assert pickle.loads(pickle.dumps(relayed)) == relayed


def _spmd(requests_of, world=tuple(range(8)), timeout=20.0, world_of=None, channel_of=None):
    """Run ``load_request`` and one run on a thread per rank: per device, its outputs or
    the exception it raised (``world_of`` / ``channel_of``: a rank's own world= and
    channel=, default ``world`` and the main channel)."""
    fabric = LocalFabric(timeout)
    out: dict[int, object] = {}

    def rank(d: int) -> None:
        ex = Executor(LocalBackend(d, fabric))
        try:
            requests, values = requests_of(d)
            loaded, tensors = ex.load_request(
                requests, CLUSTER, world=world if world_of is None else world_of(d),
                channel=None if channel_of is None else channel_of(d))
            sources = [values[k].get(d) for k in range(len(requests))]
            out[d] = (ex.run(loaded, sources).wait(), tensors)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            out[d] = e

    threads = [threading.Thread(target=rank, args=(d,), daemon=True) for d in world]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return out


def _request(shape=(64, 48)):
    rng = np.random.default_rng(5)
    value = sample(rng, shape, "float32")
    part = sample(rng, (10, 6), "int32")
    requests = [(shape, "float32", SRC, DST), ((10, 6), "int32", PARTIAL, DST)]
    return requests, [addends(rng, value, SRC), addends(rng, part, PARTIAL)], [value, part]


def test_every_rank_plans_for_itself_and_the_bytes_are_exact():
    requests, shards, values = _request()
    out = _spmd(lambda d: (requests, shards))
    for d, got in out.items():
        assert not isinstance(got, Exception), f"device {d}: {got!r}"
        dst, tensors = got
        assert [t.shape for t in tensors] == [(64, 48), (10, 6)]
        for k, value in enumerate(values):
            if d in DST.devices:
                want = value[DST.index_map(value.shape)[d]]
                assert np.array_equal(dst[k], want), (d, k)
            else:
                assert k not in dst


def test_ranks_given_different_requests_all_refuse_naming_them():
    requests, shards, _ = _request()
    other, other_shards, _ = _request((64, 40))
    out = _spmd(lambda d: (other, other_shards) if d == 5 else (requests, shards))
    for d, got in out.items():
        assert isinstance(got, reshard.PlanError), f"device {d}: {got!r}"
        assert "ranks disagree" in str(got) and "devices [5]" in str(got), str(got)
        assert "requests differ" in str(got)


def test_a_rank_whose_planning_fails_is_named_by_the_others():
    requests, shards, _ = _request()
    bad = [((63, 48, 2), "float32", SRC, DST)]  # a 2-d spec on a 3-d shape: refused
    out = _spmd(lambda d: (bad, shards) if d == 2 else (requests, shards))
    assert isinstance(out[2], reshard.ReshardError) and "planning failed" not in str(out[2])
    for d, got in out.items():
        if d != 2:
            assert isinstance(got, reshard.PlanError), f"device {d}: {got!r}"
            assert "planning failed on devices [2]" in str(got)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["world order", "world members", "channel"])
def test_ranks_given_another_world_or_channel_all_refuse(how):
    # one rank given the world in another order, a world without one of the others, or
    # another channel: every rank raises a PlanError that says to give one world and
    # channel (by the records where they could be exchanged, else naming the failed
    # exchange), not a bare timeout or "cannot connect"
    requests, shards, _ = _request()
    world = tuple(range(8))
    other = {"world order": tuple(reversed(world)), "world members": world[:7],
             "channel": world}[how]
    t0 = time.monotonic()
    out = _spmd(lambda d: (requests, shards), timeout=3.0,
                world_of=(lambda d: other if d == 5 else world),
                channel_of=(lambda d: "other" if how == "channel" and d == 5 else None))
    assert time.monotonic() - t0 < 30
    for d, got in out.items():
        if how == "world members" and d == 7:
            continue  # not in rank 5's world: it waits for the others, then fails alike
        assert isinstance(got, reshard.PlanError), f"device {d}: {got!r}"
        assert "same world= (in one order) and channel=" in str(got), str(got)


DIGESTS = r"""
import reshard
from reshard import Cluster, DeviceMesh, Layout
cl = Cluster.preset("dgx-h100", 4)
a = Layout(DeviceMesh((2, 8)), "S01R")
b = Layout(DeviceMesh((2, 8), devices=range(16, 32)), "RS10")
p = Layout(DeviceMesh((2, 8)), "S0R+P1")
reqs = [((4096, 512), "bfloat16", a, b), ((300, 260), "float32", p, b),
        ((1000, 7), "int32", b, a)] + [((64 + i, 32), "float16", a, b) for i in range(20)]
out = []
for strategy in ("broadcast", "send_recv", "allgather"):
    out.append(reshard.plan_many(reqs, cluster=cl, strategy=strategy).digest().hex())
out.append(reshard.plan((2048, 2048), "bfloat16", a, b, cluster=cl, cast="float8_e4m3fn",
                        scale="block128").digest().hex())
from reshard.planner.share import plan_share
share = plan_share(reqs, 5, cl)
assert share.plan is None and share.digest.hex() == out[0], "share and plan digests differ"
out.append(repr(share.tasks))
print(" ".join(out))
"""


@pytest.mark.timeout(120)
def test_plans_are_the_same_in_every_process_whatever_its_hash_seed():
    got = set()
    for seed in ("0", "1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-c", DIGESTS], env=env, capture_output=True,
                             check=False,
                             text=True, timeout=100)
        assert run.returncode == 0, run.stderr
        got.add(run.stdout.strip())
    assert len(got) == 1, got
    assert len(next(iter(got)).split(maxsplit=4)) == 5

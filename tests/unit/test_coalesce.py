"""Coalescing: small transfers of one step sharing their route travel as one message,
byte-exact, with exactly the plan's bytes on the wire."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.dtypes import parse_dtype
from reshard.planner.schedule.coalesce import TASK_BYTES, followers, messages, route

from ..common import check_shards, problems, put_value, sample, wire_bytes

CLUSTER = Cluster.regular(2, 2)
SRC = Layout(DeviceMesh((2,), [0, 1]), "S0R")
DST = Layout(DeviceMesh((2,), [2, 3]), "RS0")


def test_many_small_tensors_travel_in_few_messages():
    dtypes = ("float32", "bfloat16", "int8", "float64", "float8_e4m3fn", "int16")
    reqs = [((8 + i % 5, 6 + i % 3), dtypes[i % len(dtypes)], SRC, DST) for i in range(60)]
    rng = np.random.default_rng(0)
    values = [sample(rng, shape, dt) for shape, dt, _, _ in reqs]
    with reshard.Runtime("local", CLUSTER) as rt:
        xs = [rt.put(v, SRC) for v in values]
        p = rt.plan(xs, [DST] * len(xs))
        fabric = rt.group.fabric
        fabric.reset_counters()
        before = fabric.messages
        ys = rt.execute(p, xs)
        sent = fabric.messages - before
        assert fabric.total_bytes() == wire_bytes(p)  # no padding crosses the wire
        for y, v in zip(ys, values):
            check_shards(rt, y, v)
    assert len(p.tasks) == 4 * len(reqs)  # every source device sends each receiver a box
    coalesced = followers(p.tasks, p.tensors)
    assert sent == len(p.tasks) - len(coalesced) <= len(p.tasks) // 10


def test_large_transfers_and_sums_are_not_coalesced():
    big = reshard.plan((2048, 2048), "float32", SRC, DST, cluster=CLUSTER)
    assert all(route(t, big.tensors[t.tensor]) is None for t in big.tasks)
    assert all(t.nbytes > TASK_BYTES for t in big.tasks)
    part = reshard.plan((8, 8), "float32", Layout(DeviceMesh((2,), [0, 1]), "RR+P0"), DST,
                        cluster=CLUSTER)
    assert all(route(t, part.tensors[t.tensor]) is None for t in part.tasks if t.addends)


def test_messages_keep_plan_order_and_split_at_the_limit():
    p = reshard.plan_many([((64, 1024), "float32", SRC, DST)] * 40, cluster=CLUSTER)
    step0 = [t for t in p.tasks if t.step == p.tasks[0].step]
    got = messages(step0, lambda t: t, lambda t: p.tensors[t.tensor])
    assert got and all(len(m) > 1 for m in got)
    for m in got:
        assert [step0.index(t) for t in m] == sorted(step0.index(t) for t in m)
        assert len({route(t, p.tensors[t.tensor]) for t in m}) == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(problems((0, 1, 2, 3, 4, 5)), min_size=2, max_size=6),
       st.sampled_from(["broadcast", "send_recv", "allgather"]), st.integers(0, 2 ** 32 - 1))
def test_plan_many_of_small_random_tensors_is_exact(reqs, strategy, seed):
    cluster = Cluster.regular(3, 2)
    rng = np.random.default_rng(seed)
    values = [sample(rng, shape, parse_dtype(dt).name) for shape, dt, _, _ in reqs]
    with reshard.Runtime("local", cluster) as rt:
        xs = [put_value(rt, v, src, rng) for v, (_, _, src, _) in zip(values, reqs)]
        p = rt.plan(xs, [dst for _, _, _, dst in reqs], strategy)
        rt.group.fabric.reset_counters()
        ys = rt.execute(p, xs)
        assert rt.group.fabric.total_bytes() == wire_bytes(p)
        for y, v in zip(ys, values):
            check_shards(rt, y, v)


def test_the_small_tensors_model_with_a_message_cost_prices_the_same_tasks(monkeypatch):
    """``small_tensors --message-cost`` models the measured plan's own tasks with each
    backend's cost per message end: more than without it, more for a dearer backend, by
    about the cost of the messages the plan sends; the plan's cached figures are not
    reused for the new cluster."""
    from reshard.microbench import calibrate, small_tensors

    reqs = small_tensors.requests(60, low=4 << 10, high=64 << 10)
    cluster = Cluster.regular(4, 2, nic_bandwidth=1e9, intra_bandwidth=4e9)
    plan = reshard.plan_many(reqs, cluster=cluster)
    before = plan.estimate()
    envs = []

    def measured(backend, env=None):
        envs.append(env)
        return {"cheap": 1e-5, "dear": 1e-4}[backend]

    monkeypatch.setattr(calibrate, "message_cost", measured)
    rates = {"cheap": (8e9, 0.0), "dear": (8e9, 0.0)}
    got = small_tensors.with_message_cost(plan, ("cheap", "dear"), rates)
    # messages timed with the testbed's transports
    assert envs and all(e == {"UCX_TLS": "tcp"} for e in envs)
    assert got["cheap"][0] == 1e-5 and got["dear"][0] == 1e-4
    assert before < got["cheap"][1] < got["dear"][1]
    assert plan.estimate() == before  # the measured plan's own figures untouched
    # the difference is the messages' ends on the shared cores: at least one message
    # end per destination device's messages, at most every task's two ends
    ends = 2 * len(plan.tasks)
    assert got["dear"][1] - got["cheap"][1] <= ends * (1e-4 - 1e-5) * 1.01
    # a cost per part raises the model of a plan whose messages carry several boxes
    parted = small_tensors.with_message_cost(plan, ("cheap", "dear"),
                                             {"cheap": (8e9, 0.0), "dear": (8e9, 1e-5)})
    assert parted["dear"][1] > got["dear"][1] and parted["cheap"][1] == got["cheap"][1]
    # and a backend whose runtime moves fewer bytes per second of the cores, slower
    slow = small_tensors.with_message_cost(plan, ("cheap", "dear"),
                                           {"cheap": (8e9, 0.0), "dear": (2e9, 1e-5)})
    assert slow["dear"][1] > parted["dear"][1] and slow["cheap"][1] == parted["cheap"][1]
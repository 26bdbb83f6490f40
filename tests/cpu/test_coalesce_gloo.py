"""Coalesced messages on gloo workers: many small tensors in one plan travel as few
messages of several of gloo's pieces; each message is sent as soon as its payloads are
packed, and a receiver unpacks each payload as the pieces holding it land. Every
destination shard of every tensor exact."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.comm.backends.gloo import CHAIN_PIECE
from reshard.comm.engine.steps import program_steps
from reshard.comm.program import programs
from reshard.dtypes import parse_dtype
from reshard.microbench.small_tensors import requests
from reshard.planner.schedule.coalesce import followers
from reshard.planner.values.tasks import TaskKind

pytestmark = pytest.mark.cpu


@pytest.mark.timeout(240)
def test_small_tensors_in_messages_of_several_pieces_are_exact(rt):
    reqs = requests(300, seed=7, low=1 << 10, high=64 << 10)
    rng = np.random.default_rng(11)
    values = [rng.random(shape).astype(np.float32).astype(parse_dtype(dt)) * 100
              for shape, dt, _, _ in reqs]
    xs = [rt.put(v, src) for v, (_, _, src, _) in zip(values, reqs)]
    plan = rt.plan(xs, [dst for *_, dst in reqs], "broadcast")
    merged = followers(plan.tasks, plan.tensors)
    assert len(merged) > len(plan.tasks) // 2  # most tasks travel in others' messages
    kinds = {plan.tasks[i].kind for i in merged}
    assert kinds == {TaskKind.SEND, TaskKind.BROADCAST}
    # messages that span several pieces: the receivers unpack them as pieces land
    steps, _ = program_steps(programs(plan, [4])[4])
    assert max(st.message for step in steps for st in step) > 2 * CHAIN_PIECE
    for _ in range(2):  # twice on the same loaded program and scratch
        ys = rt.execute(plan, xs)
        for y, v, (*_, dst) in zip(ys, values, reqs):
            shards = rt.shards(y)
            for d, sl in dst.index_map(v.shape).items():
                assert shards[d].tobytes() == np.ascontiguousarray(v[sl]).tobytes()
        rt.free(*ys)

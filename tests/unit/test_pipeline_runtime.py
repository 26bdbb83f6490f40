"""The pipeline runtime on the local backend: the MLP example's losses, gradients and
updated parameters equal the one-process numpy reference for every shipped schedule,
and the recorded timeline has every compute action."""

from __future__ import annotations

import numpy as np
import pytest

import reshard
from reshard.pipeline import ActionKind, ScheduleError, make_schedule
from reshard.pipeline.examples import mlp
from reshard.pipeline.runtime import PipelineRuntime


@pytest.mark.parametrize("schedule,kinds,chunks", [
    ("gpipe", ("dp", "col", "dp"), 1),
    ("1f1b", ("dp", "col", "dp"), 1),
    ("eager-1f1b", ("dp", "col", "dp"), 1),
    ("eager-1f1b", ("col", "dp", "col", "dp"), 1),
    ("zb-h1", ("dp", "col", "dp"), 1),
    ("interleaved-1f1b", ("dp", "col", "dp", "dp"), 2),
    ("zb-v", ("dp", "col", "dp", "dp"), 2),  # the V: virtual stages 0 and 3 on stage 0
    ("eager-zb-v", ("dp", "col", "dp", "dp"), 2),
    ("dualpipe-v", ("dp", "col", "dp", "dp"), 2),
])
def test_mlp_matches_reference(schedule, kinds, chunks):
    rows = mlp.train("local", schedule=schedule, kinds=kinds, steps=2, chunks=chunks,
                     log=lambda *_: None)
    assert len(rows) == 2
    for r in rows:
        assert r["max_abs_diff"] < 1e-9, r
    assert rows[1]["loss"] < rows[0]["loss"]  # training makes progress


def test_mlp_names_the_chunks_a_schedule_runs():
    from reshard import ReshardError

    with pytest.raises(ReshardError, match="runs 2 chunks per stage; give chunks=2"):
        mlp.train("local", schedule="zb-v", kinds=("dp", "col"), steps=1, log=lambda *_: None)


def _setup(schedule_name="1f1b", m=3):
    meshes = [reshard.DeviceMesh((2,), devices=[0, 1]), reshard.DeviceMesh((2,), devices=[2, 3])]
    stages = mlp.make_stages(["dp", "col"], [4, 6, 2], meshes, 4, m)
    return stages, make_schedule(schedule_name, 2, m)


def test_timeline_records_every_compute_action():
    stages, sched = _setup()
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(4, 4)) for _ in range(3)]
    ts = [rng.normal(size=(4, 2)) for _ in range(3)]
    with reshard.Runtime("local") as rt:
        pipe = PipelineRuntime(rt, stages, sched)
        pipe.set_params(mlp.init_params(stages))
        res = pipe.step(xs, ts)
    for s, program in enumerate(sched.stages):
        compute = [str(a) for a in program if a.kind.is_compute]
        got = [e.action for e in res.timeline.events_on(s, "compute")]
        assert got == compute
        sends = [a for a in program if a.kind in (ActionKind.SEND_ACT, ActionKind.SEND_GRAD)]
        assert len(res.timeline.events_on(s, "send")) == len(sends)
    assert res.timeline.iteration_time > 0


def test_bad_pipeline_input():
    stages, sched = _setup()
    with reshard.Runtime("local") as rt:
        with pytest.raises(ScheduleError, match="virtual stages"):
            PipelineRuntime(rt, stages[:1], sched)
        overlapping = [stages[0], mlp.make_stages(["col"], [6, 2], [stages[0].mesh], 4, 3)[0]]
        with pytest.raises(ScheduleError, match="device 0 is in the meshes"):
            PipelineRuntime(rt, overlapping, sched)
        pipe = PipelineRuntime(rt, stages, sched)
        with pytest.raises(reshard.ReshardError, match="set_params"):
            pipe.step([], [])


def test_pipelines_of_two_names_share_a_runtime_in_turn():
    # two pipelines on other meshes of one runtime, stepped in turn: each gives the
    # losses it gives alone (each has its own stage workers: one did replace the other's)
    a_stages, sched = _setup()
    meshes = [reshard.DeviceMesh((1,), devices=[3]), reshard.DeviceMesh((3,), devices=[0, 1, 2])]
    b_stages = mlp.make_stages(["dp", "col"], [4, 6, 2], meshes, 4, 3)
    rng = np.random.default_rng(1)
    data = {name: ([rng.normal(size=(4, 4)) for _ in range(3)],
                   [rng.normal(size=(4, 2)) for _ in range(3)]) for name in "ab"}
    stages = {"a": a_stages, "b": b_stages}
    alone = {}
    for name in "ab":
        with reshard.Runtime("local") as rt:
            pipe = PipelineRuntime(rt, stages[name], sched, name=name)
            pipe.set_params(mlp.init_params(stages[name]))
            alone[name] = [pipe.step(*data[name]).losses for _ in range(2)]
    assert not np.allclose(alone["a"], alone["b"])  # the two really differ
    with reshard.Runtime("local") as rt:
        pipes = {name: PipelineRuntime(rt, stages[name], sched, name=name) for name in "ab"}
        for name, pipe in pipes.items():
            pipe.set_params(mlp.init_params(stages[name]))
        turns: dict[str, list] = {name: [] for name in "ab"}
        for _ in range(2):
            for name, pipe in pipes.items():
                turns[name].append(pipe.step(*data[name]).losses)
    for name in "ab":
        assert np.allclose(turns[name], alone[name]), name

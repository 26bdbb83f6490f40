"""Shipped schedule generators: validity, shape, registry, documented timelines."""

import inspect
import textwrap

import pytest

from reshard.pipeline import (
    SCHEDULES,
    Action,
    ActionKind,
    PipelineCosts,
    ScheduleError,
    eager_one_f_one_b,
    gpipe,
    interleaved_one_f_one_b,
    make_schedule,
    one_f_one_b,
    simulate,
    validate,
    zero_bubble_h1,
    zero_bubble_v,
)

SIZES = [(1, 1), (1, 3), (2, 1), (2, 2), (3, 2), (4, 1), (4, 3), (4, 4), (4, 5), (4, 8), (5, 7)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "eager-1f1b", "zb-h1"])
@pytest.mark.parametrize(("stages", "mbs"), SIZES)
def test_shipped_schedules_validate(name, stages, mbs):
    schedule = make_schedule(name, stages, mbs)
    assert validate(schedule) == []
    assert schedule.num_stages == stages
    assert schedule.num_microbatches == mbs


@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize(("stages", "mbs"), [*SIZES, (4, 9), (5, 6), (3, 7)])
def test_interleaved_validates(stages, mbs, chunks):
    schedule = interleaved_one_f_one_b(stages, mbs, chunks)
    assert validate(schedule) == []
    assert schedule.num_chunks == chunks


def test_transfers_surround_compute():
    schedule = one_f_one_b(3, 2)
    stage1 = [str(a) for a in schedule.stages[1]]
    # The middle stage receives before it computes and sends right after.
    assert stage1[:3] == ["RA0", "F0", "SA0"]
    i = stage1.index("B0")
    assert stage1[i - 1] == "RG0" and stage1[i + 1] == "SG0"
    # The first stage never receives activations, the last never receives grads.
    assert not any(a.kind is ActionKind.RECV_ACT for a in schedule.stages[0])
    assert not any(a.kind is ActionKind.RECV_GRAD for a in schedule.stages[2])


def _forwards_before_first_backward(program):
    count = 0
    for action in program:
        if action.kind in (ActionKind.BACKWARD, ActionKind.BACKWARD_INPUT):
            return count
        count += action.kind is ActionKind.FORWARD
    return count


def test_warmup_counts():
    assert [_forwards_before_first_backward(p) for p in one_f_one_b(4, 8).stages] == [4, 3, 2, 1]
    assert [_forwards_before_first_backward(p) for p in eager_one_f_one_b(4, 8).stages] == [
        7, 5, 3, 1,
    ]
    # Capped by the number of microbatches.
    assert [_forwards_before_first_backward(p) for p in eager_one_f_one_b(4, 3).stages] == [
        3, 3, 3, 1,
    ]
    assert [_forwards_before_first_backward(p) for p in gpipe(3, 5).stages] == [5, 5, 5]


def test_interleaved_with_one_chunk_is_eager_1f1b():
    assert interleaved_one_f_one_b(4, 8, 1) == eager_one_f_one_b(4, 8)


def test_interleaved_megatron_order():
    schedule = interleaved_one_f_one_b(2, 4, 2)
    computes = [str(a) for a in schedule.stages[0] if a.kind.is_compute]
    # Warm-up 2*(2-0-1) + (2-1)*2 = 4 chunk-forwards, then forward/backward pairs.
    assert computes[:4] == ["F0", "F1", "F0@1", "F1@1"]
    assert computes[4:8] == ["F2", "B0@1", "F3", "B1@1"]


def test_zero_bubble_splits_backward():
    schedule = zero_bubble_h1(4, 8)
    kinds = {a.kind for p in schedule.stages for a in p}
    assert ActionKind.BACKWARD not in kinds
    assert {ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT} <= kinds
    # The last stage sends the input grad right after I, before the W.
    last = [str(a) for a in schedule.stages[3]]
    assert last[last.index("I0") + 1] == "SG0"
    # W fills bubbles: with F=I=W=1 ZB-H1 beats 1F1B at equal peak memory.
    costs = PipelineCosts(forward=1, backward=2)
    zb, base = simulate(schedule, costs), simulate(one_f_one_b(4, 8), costs)
    assert zb.iteration_time < base.iteration_time
    assert max(zb.peak_activations) == max(base.peak_activations) == 4


def test_registry_is_read_only_and_complete():
    assert set(SCHEDULES) == {"gpipe", "1f1b", "eager-1f1b", "interleaved-1f1b", "zb-h1",
                              "zb-v", "eager-zb-v", "dualpipe-v"}
    with pytest.raises(TypeError):
        SCHEDULES["mine"] = gpipe  # type: ignore[index]


def test_make_schedule_unknown_name_lists_valid_names():
    with pytest.raises(ScheduleError) as info:
        make_schedule("2f2b", 4, 8)
    for name in SCHEDULES:
        assert name in str(info.value)


def test_make_schedule_passes_options_and_checks_counts():
    assert make_schedule("interleaved-1f1b", 2, 4, n_chunks=3).num_chunks == 3
    with pytest.raises(ScheduleError):
        make_schedule("1f1b", 0, 4)
    with pytest.raises(ScheduleError):
        make_schedule("1f1b", 2, 4, n_chunks=3)


@pytest.mark.parametrize(
    ("function", "schedule", "costs"),
    [
        (gpipe, gpipe(4, 8), PipelineCosts(forward=1, backward=1)),
        (one_f_one_b, one_f_one_b(4, 8), PipelineCosts(forward=1, backward=1)),
        (eager_one_f_one_b, eager_one_f_one_b(4, 8), PipelineCosts(forward=1, backward=1)),
        (
            interleaved_one_f_one_b,
            interleaved_one_f_one_b(4, 4, 2),
            PipelineCosts(forward=1, backward=1),
        ),
        (zero_bubble_h1, zero_bubble_h1(4, 8), PipelineCosts(forward=1, backward=2)),
        (zero_bubble_v, zero_bubble_v(4, 4), PipelineCosts(forward=1, backward=2)),
    ],
)
def test_docstring_timelines_are_current(function, schedule, costs):
    doc = inspect.getdoc(function)
    assert textwrap.indent(simulate(schedule, costs).to_ascii(), "    ") in doc


def test_actions_are_unique_per_stage():
    for name in SCHEDULES:
        for program in make_schedule(name, 3, 6).stages:
            assert len(set(program)) == len(program)
            assert all(isinstance(a, Action) for a in program)


def test_custom_schedule_example_runs(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra draws the example's figure")
    from reshard.pipeline.examples.custom_schedule import main

    report = main([str(tmp_path / "custom.png")])
    assert "iteration time 11" in report and "iteration time 10" in report
    assert "deadlock: stage 0 step 1 (RG0)" in report
    assert (tmp_path / "custom.png").stat().st_size > 0

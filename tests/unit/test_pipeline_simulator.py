"""Simulator, costs, timelines and the schedule comparison."""

import dataclasses

import pytest

from reshard.pipeline import (
    ActionKind,
    PipelineCosts,
    Schedule,
    ScheduleError,
    Stream,
    Timeline,
    TimelineEvent,
    compare_schedules,
    eager_one_f_one_b,
    format_table,
    gpipe,
    interleaved_one_f_one_b,
    make_schedule,
    one_f_one_b,
    plan_times,
    simulate,
)


def _compute(timeline, stage):
    return [(e.action, e.start, e.end) for e in timeline.events_on(stage, "compute")]


def test_two_stages_two_microbatches_no_transfer():
    # stage 0: F0 SA0 F1 SA1 RG0 B0 RG1 B1 / stage 1: RA0 F0 B0 SG0 RA1 F1 B1 SG1
    # s0 F0 0-1, F1 1-2; s1 F0 1-2, B0 2-4, F1 4-5, B1 5-7; s0 B0 4-6, B1 7-9.
    timeline = simulate(one_f_one_b(2, 2), PipelineCosts(forward=1, backward=2))
    assert _compute(timeline, 0) == [("F0", 0, 1), ("F1", 1, 2), ("B0", 4, 6), ("B1", 7, 9)]
    assert _compute(timeline, 1) == [("F0", 1, 2), ("B0", 2, 4), ("F1", 4, 5), ("B1", 5, 7)]
    assert timeline.iteration_time == 9  # (m + n - 1)(f + b) = 3 * 3
    # Stage 0 computes 6 of 9, stage 1 computes 6 of 9.
    assert timeline.bubble_fraction == pytest.approx((1 / 3, 1 / 3))
    assert timeline.peak_activations == (2, 1)


def test_two_stages_two_microbatches_with_transfer():
    # transfer = 0.5 for activations and gradients:
    # s0: F0 0-1, SA0 on the wire 1-1.5; F1 1-2, SA1 2-2.5.
    # s1: RA0 done 1.5 -> F0 1.5-2.5, B0 2.5-4.5, SG0 on the wire 4.5-5.0;
    #     RA1 arrived at 2.5 -> F1 4.5-5.5, B1 5.5-7.5, SG1 7.5-8.0.
    # s0: RG0 at 5.0 -> B0 5.0-7.0; RG1 at 8.0 -> B1 8.0-10.0. Iteration time 10.
    costs = PipelineCosts(forward=1, backward=2, activation_transfer=0.5)
    timeline = simulate(one_f_one_b(2, 2), costs)
    assert _compute(timeline, 0) == [("F0", 0, 1), ("F1", 1, 2), ("B0", 5, 7), ("B1", 8, 10)]
    assert _compute(timeline, 1) == [
        ("F0", 1.5, 2.5), ("B0", 2.5, 4.5), ("F1", 4.5, 5.5), ("B1", 5.5, 7.5),
    ]
    assert timeline.iteration_time == 10
    sends = [(e.action, e.start, e.end) for e in timeline.events_on(1, Stream.SEND)]
    assert sends == [("SG0", 4.5, 5.0), ("SG1", 7.5, 8.0)]
    recvs = [(e.action, e.start, e.end) for e in timeline.events_on(0, Stream.RECV)]
    assert recvs == [("RG0", 4.5, 5.0), ("RG1", 7.5, 8.0)]


def test_link_is_fifo_one_transfer_at_a_time():
    # GPipe, 2 stages, f=1, b=2, transfer=2.
    # s0: F0 0-1, SA0 wire 1-3; F1 1-2, SA1 issued at 2 but the link is busy: 3-5.
    # s1: F0 3-4, F1 5-6, B0 6-8 (SG0 8-10), B1 8-10 (SG1 waits: 10-12).
    # s0: B0 10-12, B1 12-14.
    costs = PipelineCosts(forward=1, backward=2, activation_transfer=2)
    timeline = simulate(gpipe(2, 2), costs)
    sends = [(e.action, e.start, e.end) for e in timeline.events_on(0, Stream.SEND)]
    assert sends == [("SA0", 1, 3), ("SA1", 3, 5)]
    assert _compute(timeline, 1) == [("F0", 3, 4), ("F1", 5, 6), ("B0", 6, 8), ("B1", 8, 10)]
    assert _compute(timeline, 0)[-2:] == [("B0", 10, 12), ("B1", 12, 14)]
    assert timeline.iteration_time == 14


@pytest.mark.parametrize(("stages", "mbs"), [(1, 1), (2, 3), (4, 8), (3, 5)])
@pytest.mark.parametrize(("fwd", "bwd"), [(1.0, 2.0), (0.5, 0.75)])
def test_gpipe_and_1f1b_textbook_time(stages, mbs, fwd, bwd):
    costs = PipelineCosts(forward=fwd, backward=bwd)
    expected = (mbs + stages - 1) * (fwd + bwd)
    assert simulate(gpipe(stages, mbs), costs).iteration_time == pytest.approx(expected)
    assert simulate(one_f_one_b(stages, mbs), costs).iteration_time == pytest.approx(expected)
    assert simulate(eager_one_f_one_b(stages, mbs), costs).iteration_time == pytest.approx(
        expected
    )


def test_interleaved_bubble_shrinks_by_chunks():
    # Per chunk f = 1/2, b = 1: bubble (n - 1)(f + b) / v = 3 * 3 / 2.
    costs = PipelineCosts(forward=0.5, backward=1.0)
    timeline = simulate(interleaved_one_f_one_b(4, 8, 2), costs)
    assert timeline.iteration_time == pytest.approx(8 * 3 + 3 * 3 / 2)


def test_eager_beats_1f1b_when_transfer_is_comparable_to_compute():
    costs = PipelineCosts(forward=1, backward=2, activation_transfer=1)
    eager = simulate(eager_one_f_one_b(4, 8), costs)
    base = simulate(one_f_one_b(4, 8), costs)
    assert eager.iteration_time < base.iteration_time
    assert eager.peak_activations[0] > base.peak_activations[0]
    assert base.peak_activations == (4, 3, 2, 1)
    assert eager.peak_activations == (7, 5, 3, 1)


def test_compare_schedules_table():
    free = {r["schedule"]: r for r in compare_schedules(4, 8, 1.0, 2.0, 0.0)}
    assert free["1f1b"]["iteration_time"] == free["eager-1f1b"]["iteration_time"] == 33
    slow = {r["schedule"]: r for r in compare_schedules(4, 8, 1.0, 2.0, 1.0)}
    assert slow["eager-1f1b"]["iteration_time"] < slow["1f1b"]["iteration_time"]
    assert slow["eager-1f1b"]["bubble_fraction"] < slow["1f1b"]["bubble_fraction"]
    assert slow["eager-1f1b"]["peak_activations"][0] > slow["1f1b"]["peak_activations"][0]
    # Interleaved activations are counted in whole-stage units.
    assert free["interleaved-1f1b"]["peak_activations"][0] == 5.5
    table = format_table(list(free.values()))
    assert table.splitlines()[0].split() == [
        "schedule", "iteration_time", "bubble_fraction", "peak_activations",
    ]
    assert len(table.splitlines()) == 1 + len(free)


def test_split_backward_costs_default_to_halves():
    schedule = make_schedule("zb-h1", 1, 1)
    timeline = simulate(schedule, PipelineCosts(forward=1, backward=3))
    assert _compute(timeline, 0) == [("F0", 0, 1), ("I0", 1, 2.5), ("W0", 2.5, 4)]
    costs = PipelineCosts(forward=1, backward=3, backward_input=1)
    assert costs.compute_time(ActionKind.BACKWARD_WEIGHT, 0) == 2
    with pytest.raises(ScheduleError, match="exceeds backward"):
        PipelineCosts(backward=1, backward_input=2).compute_time(ActionKind.BACKWARD_WEIGHT, 0)


def test_per_stage_and_callable_costs():
    costs = PipelineCosts(
        forward=[1, 2], backward=lambda v: 2.0 * (v + 1), activation_transfer=(0.25,),
        gradient_transfer=lambda b: 0.5,
    )
    assert costs.forward == (1.0, 2.0)
    assert costs.compute_time(ActionKind.FORWARD, 1) == 2
    assert costs.compute_time(ActionKind.BACKWARD, 1) == 4
    assert costs.transfer_time(ActionKind.SEND_ACT, 0) == 0.25
    assert costs.transfer_time(ActionKind.SEND_GRAD, 0) == 0.5
    timeline = simulate(one_f_one_b(2, 1), costs)
    # F0 s0 0-1, wire 1-1.25, F0 s1 1.25-3.25, B0 s1 3.25-7.25, wire 7.25-7.75, B0 s0 -9.75
    assert timeline.iteration_time == pytest.approx(9.75)
    with pytest.raises(ScheduleError, match="activation_transfer gives 1 values but index 1"):
        simulate(one_f_one_b(3, 1), costs)


@pytest.mark.parametrize("bad", [-1, float("nan"), "1", [1, -2], True])
def test_bad_costs_rejected(bad):
    with pytest.raises(ScheduleError):
        PipelineCosts(forward=bad)


def test_costs_are_frozen_and_hashable():
    costs = PipelineCosts(forward=[1, 2])
    assert hash(costs) == hash(PipelineCosts(forward=(1.0, 2.0)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        costs.forward = 3  # type: ignore[misc]


class _Plan:
    def __init__(self, seconds):
        self.seconds = seconds

    def estimate(self):
        return self.seconds


def test_transfer_costs_from_plans():
    assert plan_times([_Plan(0.5), _Plan(1.25)]) == (0.5, 1.25)
    costs = PipelineCosts.from_plans([_Plan(0.5)], forward=1, backward=2)
    assert costs.activation_transfer == (0.5,)
    assert costs.transfer_time(ActionKind.SEND_GRAD, 0) == 0.5
    assert simulate(one_f_one_b(2, 2), costs).iteration_time == 10  # as the hand case above
    costs = PipelineCosts.from_plans([_Plan(0.5)], [_Plan(2.0)])
    assert costs.transfer_time(ActionKind.SEND_GRAD, 0) == 2.0
    with pytest.raises(ScheduleError, match="no estimate"):
        plan_times([object()])
    with pytest.raises(ScheduleError, match="estimate"):
        plan_times([_Plan(-1.0)])


def test_simulate_rejects_invalid_schedule():
    deadlocked = Schedule.from_text("stage 0: F0 RG0 SA0 B0\nstage 1: RA0 F0 B0 SG0\n")
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(deadlocked)


def test_timeline_from_recorded_events_matches_simulation_fields():
    simulated = simulate(one_f_one_b(2, 2), PipelineCosts(forward=1, backward=2))
    records = simulated.to_records()
    assert records[0] == {"stage": 0, "stream": "compute", "action": "F0", "start": 0.0, "end": 1.0}
    # A runtime records wall-clock times: shifting them changes nothing derived.
    shifted = [dict(r, start=r["start"] + 1000.0, end=r["end"] + 1000.0) for r in records]
    measured = Timeline.from_records(shifted)
    assert measured.num_stages == 2
    assert measured.iteration_time == simulated.iteration_time
    assert measured.bubble_fraction == simulated.bubble_fraction
    assert measured.peak_activations == simulated.peak_activations
    assert Timeline.from_records(records) == simulated


def test_timeline_statistics_by_hand():
    events = [
        TimelineEvent(0, "compute", "F0", 0, 1),
        TimelineEvent(0, "compute", "F1", 1, 2),
        TimelineEvent(0, "compute", "I0", 3, 4),
        TimelineEvent(0, "compute", "W0", 4, 5),
        TimelineEvent(0, "compute", "B1", 5, 6),
        TimelineEvent(0, "send", "SA0", 1, 3),
        TimelineEvent(1, "compute", "custom-kernel", 2, 8),
    ]
    timeline = Timeline(tuple(events))
    assert timeline.iteration_time == 8
    assert timeline.busy_time(0) == 5
    assert timeline.bubble_fraction == pytest.approx((3 / 8, 2 / 8))
    assert timeline.peak_activations == (2, 0)  # I alone frees nothing; W and B do
    assert "stage 0: bubble 37.5%" in timeline.summary()


def test_timeline_event_checks():
    with pytest.raises(ScheduleError, match=r"unknown stream 'gpu'.*compute.*send.*recv"):
        TimelineEvent(0, "gpu", "F0", 0, 1)
    with pytest.raises(ScheduleError, match="start <= end"):
        TimelineEvent(0, "compute", "F0", 2, 1)
    with pytest.raises(ScheduleError, match="num_stages"):
        Timeline((TimelineEvent(3, "compute", "F0", 0, 1),), num_stages=2)


def test_to_ascii():
    timeline = simulate(one_f_one_b(2, 2), PipelineCosts(forward=1, backward=1))
    assert timeline.to_ascii().splitlines() == [
        "0: F0 F1 .. B0 .. B1",
        "1: .. F0 B0 F1 B1 ..",
    ]


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra")
    costs = PipelineCosts(forward=1, backward=2, activation_transfer=0.5)
    path = simulate(eager_one_f_one_b(3, 4), costs).plot(tmp_path / "gantt.png", title="eager")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 5000

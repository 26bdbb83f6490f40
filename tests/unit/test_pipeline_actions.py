"""Actions and schedules: text grammar, round trips, structure helpers."""

import pytest

from reshard.pipeline import (
    SCHEDULES,
    Action,
    ActionKind,
    Channel,
    Schedule,
    ScheduleError,
    make_schedule,
)


@pytest.mark.parametrize(
    ("text", "kind", "mb", "chunk"),
    [
        ("F3", ActionKind.FORWARD, 3, 0),
        ("B0", ActionKind.BACKWARD, 0, 0),
        ("I12", ActionKind.BACKWARD_INPUT, 12, 0),
        ("W2@1", ActionKind.BACKWARD_WEIGHT, 2, 1),
        ("SA2", ActionKind.SEND_ACT, 2, 0),
        ("RA7@3", ActionKind.RECV_ACT, 7, 3),
        ("SG5@1", ActionKind.SEND_GRAD, 5, 1),
        ("RG0", ActionKind.RECV_GRAD, 0, 0),
    ],
)
def test_action_parse_and_str_round_trip(text, kind, mb, chunk):
    action = Action.parse(text)
    assert action == Action(kind, mb, chunk)
    assert str(action) == text
    assert Action.parse(str(action)) == action
    assert eval(repr(action), {"Action": Action}) == action


def test_chunk_zero_suffix_is_optional_and_canonicalised():
    assert Action.parse("F3@0") == Action.parse("F3")
    assert str(Action.parse("F3@0")) == "F3"


def test_every_kind_round_trips():
    for kind in ActionKind:
        for chunk in (0, 2):
            action = Action(kind, 4, chunk)
            assert Action.parse(str(action)) == action


@pytest.mark.parametrize(
    "bad", ["X3", "F", "f3", "F-1", "SA", "S3", "F3@", "F3@x", "", "F 3", "3F", "1F3", "FF3"]
)
def test_bad_action_text_names_the_token_and_lists_forms(bad):
    with pytest.raises(ScheduleError) as info:
        Action.parse(bad)
    message = str(info.value)
    assert repr(bad) in message
    assert "F, B, I, W, SA, RA, SG, RG" in message


def test_schedule_error_is_a_value_error():
    with pytest.raises(ValueError):
        Action.parse("nope")


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_action_rejects_bad_microbatch(bad):
    with pytest.raises(ScheduleError):
        Action(ActionKind.FORWARD, bad)


def test_kind_predicates():
    assert ActionKind.FORWARD.is_compute and not ActionKind.FORWARD.is_transfer
    assert ActionKind.SEND_ACT.is_send and ActionKind.SEND_GRAD.is_send
    assert ActionKind.RECV_ACT.is_recv and ActionKind.RECV_GRAD.is_recv
    assert not ActionKind.RECV_ACT.is_send and ActionKind.RECV_ACT.is_transfer


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize(("stages", "mbs"), [(1, 1), (3, 2), (4, 8)])
def test_schedule_text_round_trip(name, stages, mbs):
    if name == "dualpipe-v":
        mbs = max(mbs, 2 * stages)  # its least
    schedule = make_schedule(name, stages, mbs)
    text = schedule.to_text()
    assert len(text.splitlines()) == stages + 1
    again = Schedule.from_text(text)
    assert again == schedule
    assert again.to_text() == text
    assert str(schedule) == text
    assert eval(repr(schedule), {"Schedule": Schedule}) == schedule


def test_from_text_without_header_infers_counts_and_ignores_comments():
    text = """
    # two stages, hand written
    stage 0: F0 SA0 F1 SA1 RG0 B0 RG1 B1   # stage 0
    stage 1: RA0 F0 B0 SG0 RA1 F1 B1 SG1
    """
    schedule = Schedule.from_text(text)
    assert schedule.num_stages == 2
    assert schedule.num_microbatches == 2
    assert schedule.num_chunks == 1
    assert schedule.stages[1][0] == Action.parse("RA0")


def test_from_text_errors_name_the_line():
    with pytest.raises(ScheduleError, match=r"line 2: bad action 'Q1'"):
        Schedule.from_text("stage 0: F0 B0\nstage 1: Q1\n")
    with pytest.raises(ScheduleError, match="lacks stages"):
        Schedule.from_text("stage 0: F0 B0\nstage 2: F0 B0\n")
    with pytest.raises(ScheduleError, match="given twice"):
        Schedule.from_text("stage 0: F0 B0\nstage 0: F0 B0\n")
    with pytest.raises(ScheduleError, match="expected 'stage N"):
        Schedule.from_text("stage 0: F0 B0\nmicrobatches=1\n")
    with pytest.raises(ScheduleError, match="no 'stage N"):
        Schedule.from_text("microbatches=1 chunks=1\n")


def test_schedule_constructor_checks_shape():
    with pytest.raises(ScheduleError):
        Schedule((), 1)
    with pytest.raises(ScheduleError):
        Schedule((("F0",),), 0)
    with pytest.raises(ScheduleError):
        Schedule(("F0 B0",), 1)
    schedule = Schedule([["F0", "B0"]], 1)
    assert schedule.stages == ((Action.parse("F0"), Action.parse("B0")),)
    assert hash(schedule) == hash(Schedule.from_lists([["F0", "B0"]]))


def test_peer_channel_and_boundary_for_interleaved_wraparound():
    schedule = Schedule.from_lists([[], [], []], num_microbatches=1, num_chunks=2)
    # Last stage, chunk 0 (virtual 2) sends to stage 0, chunk 1 (virtual 3).
    send = Action.parse("SA0")
    assert schedule.peer(2, send) == (0, Action.parse("RA0@1"))
    assert schedule.channel(2, send) == Channel(ActionKind.SEND_ACT, 2, 0)
    assert schedule.boundary(2, send) == 2
    assert schedule.peer(0, Action.parse("RA0@1")) == (2, send)
    assert schedule.channel(0, Action.parse("RA0@1")) == Channel(ActionKind.SEND_ACT, 2, 0)
    # Gradients go back the same way.
    assert schedule.peer(0, Action.parse("SG0@1")) == (2, Action.parse("RG0"))
    # The ends of the pipeline have no peers; nor do compute actions.
    assert schedule.peer(0, Action.parse("RA0")) is None
    assert schedule.peer(2, Action.parse("SA0@1")) is None
    assert schedule.peer(1, Action.parse("F0")) is None


def test_single_stage_chunks_hand_over_locally():
    schedule = Schedule.from_lists([[]], num_microbatches=1, num_chunks=2)
    assert schedule.peer(0, Action.parse("SA0")) is None


def test_grid_lists_steps_and_marks_cells():
    schedule = make_schedule("1f1b", 2, 2)
    grid = schedule.grid()
    lines = grid.splitlines()
    assert lines[0].split()[:3] == ["step", "0", "1"]
    assert lines[1].split()[:4] == ["stage", "0", "F0", "SA0"]
    assert lines[2].split()[:4] == ["stage", "1", "RA0", "F0"]
    marked = schedule.grid(marks=[(1, 1)])
    assert ">F0<" in marked.splitlines()[2]
    assert ">" not in marked.splitlines()[1]


def test_every_action_kind_has_one_worker_handler():
    from reshard.pipeline.worker import _HANDLERS

    assert set(_HANDLERS) == set(ActionKind)

"""validate() / check(): crafted bad schedules are caught at the right step."""

import pytest

from reshard.pipeline import (
    Action,
    ProblemKind,
    Schedule,
    ScheduleError,
    check,
    format_problems,
    one_f_one_b,
    validate,
)

GOOD = """
stage 0: F0 SA0 F1 SA1 RG0 B0 RG1 B1
stage 1: RA0 F0 B0 SG0 RA1 F1 B1 SG1
"""


def _schedule(*lines: str) -> Schedule:
    return Schedule.from_text("\n".join(f"stage {i}: {line}" for i, line in enumerate(lines)))


def test_good_schedule_has_no_problems():
    schedule = Schedule.from_text(GOOD)
    assert schedule == one_f_one_b(2, 2)
    assert validate(schedule) == []
    check(schedule)


def test_receive_before_send_deadlock_names_step_and_cycle():
    # Stage 0 waits for the grad of mb 0 before sending its activation, and stage 1
    # waits for that activation before it can make the grad.
    schedule = _schedule("F0 RG0 SA0 B0", "RA0 F0 B0 SG0")
    problems = validate(schedule)
    assert [p.kind for p in problems] == [ProblemKind.DEADLOCK]
    problem = problems[0]
    assert (problem.stage, problem.step, str(problem.action)) == (0, 1, "RG0")
    assert "stage 0 blocks at step 1 on RG0, waiting for stage 1 to send SG0 at its step 3" in (
        problem.message
    )
    assert "stage 1 blocks at step 0 on RA0, waiting for stage 0 to send SA0 at its step 2" in (
        problem.message
    )
    assert set(problem.cells) == {(0, 1), (1, 3), (1, 0), (0, 2)}


def test_deadlock_reports_the_cycle_not_the_stages_waiting_on_it():
    schedule = _schedule(
        "F0 SA0 RG0 B0",
        "RA0 F0 RG0 SA0 B0 SG0",  # waits for the grad before sending the activation
        "RA0 F0 B0 SG0",
    )
    problems = validate(schedule)
    assert [p.kind for p in problems] == [ProblemKind.DEADLOCK]
    problem = problems[0]
    assert (problem.stage, problem.step, str(problem.action)) == (1, 2, "RG0")
    assert "stage 2 blocks at step 0 on RA0" in problem.message
    assert "also blocked: stage 0 at step 2 (RG0)" in problem.message


def test_receives_out_of_send_order_deadlock_on_fifo_link():
    schedule = _schedule(
        "F0 SA0 F1 SA1 RG0 B0 RG1 B1",
        "RA1 F1 RA0 F0 B0 SG0 B1 SG1",
    )
    problems = validate(schedule)
    assert [p.kind for p in problems] == [ProblemKind.DEADLOCK]
    assert (problems[0].stage, problems[0].step, str(problems[0].action)) == (1, 0, "RA1")
    assert "FIFO" in problems[0].message and "activations 0->1" in problems[0].message


def test_missing_backward():
    schedule = _schedule("F0 SA0 F1 SA1 RG0 B0 RG1", "RA0 F0 B0 SG0 RA1 F1 B1 SG1")
    problems = validate(schedule)
    assert [(p.kind, p.stage, p.step, str(p.action)) for p in problems] == [
        (ProblemKind.MISSING, 0, None, "B1")
    ]
    assert "microbatch 1" in problems[0].message


def test_missing_send_names_the_receive_it_should_match():
    schedule = _schedule("F0 F1 SA1 RG0 B0 RG1 B1", "RA0 F0 B0 SG0 RA1 F1 B1 SG1")
    problems = validate(schedule)
    assert [(p.kind, p.stage, str(p.action)) for p in problems] == [
        (ProblemKind.MISSING, 0, "SA0")
    ]
    assert "RA0 on stage 1" in problems[0].message


def test_duplicated_forward_names_the_second_occurrence():
    schedule = _schedule("F0 SA0 F1 SA1 RG0 B0 RG1 B1", "RA0 F0 B0 SG0 RA1 F1 F1 B1 SG1")
    problems = validate(schedule)
    assert [(p.kind, p.stage, p.step, str(p.action)) for p in problems] == [
        (ProblemKind.DUPLICATE, 1, 6, "F1")
    ]
    assert problems[0].related == ((1, 5),)


def test_forward_before_its_receive():
    schedule = _schedule("F0 SA0 F1 SA1 RG0 B0 RG1 B1", "RA0 F0 B0 SG0 F1 RA1 B1 SG1")
    problems = validate(schedule)
    assert [(p.kind, p.stage, p.step, str(p.action)) for p in problems] == [
        (ProblemKind.ORDER, 1, 4, "F1")
    ]
    assert "RA1 (step 5)" in problems[0].message


@pytest.mark.parametrize(
    ("stage0", "stage1", "expected"),
    [
        # send before the forward that makes the data
        ("SA0 F0 SA1 F1 RG0 B0 RG1 B1", "RA0 F0 B0 SG0 RA1 F1 B1 SG1", (0, 0, "SA0")),
        # backward before the grad arrives
        ("F0 SA0 F1 SA1 B0 RG0 RG1 B1", "RA0 F0 B0 SG0 RA1 F1 B1 SG1", (0, 4, "B0")),
        # backward before its own forward
        ("F0 SA0 F1 SA1 RG0 B0 RG1 B1", "RA0 B0 F0 SG0 RA1 F1 B1 SG1", (1, 1, "B0")),
    ],
)
def test_order_violations(stage0, stage1, expected):
    problems = validate(_schedule(stage0, stage1))
    assert problems and problems[0].kind is ProblemKind.ORDER
    assert (problems[0].stage, problems[0].step, str(problems[0].action)) == expected


def test_weight_grad_before_input_grad():
    problems = validate(_schedule("F0 SA0 RG0 W0 I0", "RA0 F0 I0 SG0 W0"))
    assert [(p.kind, p.stage, p.step, str(p.action)) for p in problems] == [
        (ProblemKind.ORDER, 0, 3, "W0")
    ]


def test_split_and_whole_backward_together_is_a_duplicate():
    problems = validate(_schedule("F0 SA0 RG0 B0 W0", "RA0 F0 B0 SG0"))
    assert problems[0].kind is ProblemKind.DUPLICATE
    assert str(problems[0].action) == "W0"
    problems = validate(_schedule("F0 SA0 RG0 I0", "RA0 F0 B0 SG0"))
    assert [(p.kind, str(p.action)) for p in problems] == [(ProblemKind.MISSING, "W0")]


def test_invalid_actions():
    problems = validate(
        Schedule.from_lists([["RA0", "F0", "SA0", "RG0", "B0", "F5"], ["RA0", "F0", "B0", "SG0"]],
                            num_microbatches=1)
    )
    invalid = [(p.stage, p.step, str(p.action)) for p in problems if p.kind is ProblemKind.INVALID]
    assert invalid == [(0, 0, "RA0"), (0, 5, "F5")]
    assert "no previous stage" in problems[0].message


def test_local_chunk_order_on_a_single_stage():
    good = Schedule.from_lists([["F0", "F0@1", "B0@1", "B0"]])
    assert good.num_chunks == 2 and validate(good) == []
    bad = Schedule.from_lists([["F0@1", "F0", "B0@1", "B0"]])
    problems = validate(bad)
    assert [(p.kind, p.step, str(p.action)) for p in problems] == [(ProblemKind.ORDER, 0, "F0@1")]


def test_check_raises_with_marked_grid():
    schedule = _schedule("F0 RG0 SA0 B0", "RA0 F0 B0 SG0")
    with pytest.raises(ScheduleError) as info:
        check(schedule)
    message = str(info.value)
    assert message.startswith("deadlock: stage 0 step 1 (RG0)")
    assert ">RG0<" in message and ">SG0<" in message
    assert len(info.value.problems) == 1
    assert info.value.problems[0].action == Action.parse("RG0")


def test_format_problems_marks_every_offending_cell():
    schedule = _schedule("SA0 F0 SA1 F1 RG0 B0 RG1 B1", "RA0 F0 B0 SG0 F1 RA1 B1 SG1")
    problems = validate(schedule)
    # SA0 and SA1 on stage 0 come before their forwards; F1 on stage 1 before RA1.
    assert [(p.stage, p.step) for p in problems] == [(0, 0), (0, 2), (1, 4)]
    text = format_problems(schedule, problems)
    assert ">SA0<" in text and ">SA1<" in text and ">F1<" in text and ">RA1<" in text
    assert text.splitlines()[-3:] == [str(p) for p in problems]


def test_order_problems_are_reported_alongside_missing_ones():
    problems = validate(_schedule("F0 SA0 RG0", "F0 RA0 B0 SG0"))
    assert [(p.kind, p.stage, p.step, str(p.action)) for p in problems] == [
        (ProblemKind.MISSING, 0, None, "B0"),
        (ProblemKind.ORDER, 1, 0, "F0"),
    ]

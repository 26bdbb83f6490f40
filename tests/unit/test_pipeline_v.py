"""V-shaped schedules: the V placement, ZB-V and DualPipeV, and torch's own schedules
converted into reshard's IR as the oracle."""

from __future__ import annotations

import pytest

from reshard.pipeline import SCHEDULES, PipelineCosts, Schedule, ScheduleError, simulate, validate
from reshard.pipeline.actions import ActionKind
from reshard.pipeline.generators import make_schedule

SIZES = [(1, 2), (2, 4), (3, 6), (4, 8), (4, 12), (5, 11)]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_the_v_placement_puts_the_first_and_last_virtual_stage_on_stage_0(n):
    s = Schedule(tuple(() for _ in range(n)), 1, 2, "v")
    seen = set()
    for v in range(2 * n):
        stage, chunk = s.locate(v)
        assert s.virtual_stage(stage, chunk) == v
        seen.add((stage, chunk))
    assert len(seen) == 2 * n
    assert s.locate(0) == (0, 0) and s.locate(2 * n - 1) == (0, 1)
    assert s.locate(n - 1)[0] == s.locate(n)[0] == n - 1  # the turn stays on one stage


def test_a_v_schedules_text_names_its_placement():
    s = make_schedule("zb-v", 3, 6)
    text = s.to_text()
    assert text.splitlines()[0] == "microbatches=6 chunks=2 placement=v"
    assert Schedule.from_text(text) == s
    with pytest.raises(ScheduleError, match="placement"):
        Schedule((("F0",),), 1, 1, "w")


@pytest.mark.parametrize("name", ["zb-v", "dualpipe-v"])
@pytest.mark.parametrize("n, m", SIZES)
def test_v_schedules_validate(name, n, m):
    if name == "dualpipe-v" and m < 2 * n:
        with pytest.raises(ScheduleError, match="at least 2"):
            make_schedule(name, n, m)
        return
    s = make_schedule(name, n, m)
    assert name in SCHEDULES and s.placement == "v" and s.num_chunks == 2
    validate(s)
    for stage in s.stages:  # every chunk's F, I and W of every microbatch, once
        compute = [a for a in stage if a.kind.is_compute]
        done = {(a.microbatch, a.chunk) for a in compute if a.kind is ActionKind.FORWARD}
        assert done == {(k, c) for k in range(m) for c in (0, 1)}


def _run(name, n=4, m=8, transfer=0.0, options=None):
    chunks = 2 if name in ("zb-v", "dualpipe-v") else 1
    costs = PipelineCosts(forward=1 / chunks, backward=2 / chunks, activation_transfer=transfer)
    t = simulate(make_schedule(name, n, m, **(options or {})), costs)
    return t.iteration_time, t.mean_bubble_fraction, max(t.peak_activations) / chunks


def test_zb_v_has_a_third_of_1f1bs_bubble_at_1f1bs_peak_memory():
    _, zb_bubble, zb_peak = _run("zb-v")
    _, bubble, peak = _run("1f1b")
    assert zb_bubble <= bubble / 3
    assert zb_peak <= peak


def test_transfer_aware_zb_v_gains_where_transfers_are_exposed():
    for transfer in (0.5, 1.0):
        aware, _, peak = _run("zb-v", transfer=transfer, options={"transfer": 2 * transfer})
        plain, _, _ = _run("zb-v", transfer=transfer)
        assert aware < 0.9 * plain, (transfer, aware, plain)
        assert peak <= 4  # 1F1B's
    with pytest.raises(ScheduleError, match="transfer"):
        make_schedule("zb-v", 4, 8, transfer=-1)


@pytest.mark.parametrize("n, m", [(2, 4), (3, 6), (4, 8), (4, 12)])
def test_dualpipe_v_is_torchs_order(n, m):
    pytest.importorskip("torch")
    from reshard.pipeline.torch_orders import torch_schedule

    theirs = torch_schedule("dualpipe-v", n, m)
    validate(theirs)
    assert theirs == make_schedule("dualpipe-v", n, m)


@pytest.mark.parametrize("n, m", [(2, 4), (3, 6), (4, 8), (4, 16), (5, 10), (6, 12)])
def test_torchs_zb_v_validates_here_and_ours_is_no_slower_without_transfers(n, m):
    """(At 8 stages torch's hand-built order is 4% faster: not tested as met.)"""
    pytest.importorskip("torch")
    from reshard.pipeline.torch_orders import torch_schedule

    theirs = torch_schedule("zb-v", n, m)
    validate(theirs)
    costs = PipelineCosts(forward=0.5, backward=1.0, activation_transfer=0.0)
    ours = simulate(make_schedule("zb-v", n, m), costs)
    assert ours.iteration_time <= simulate(theirs, costs).iteration_time


def _sends_overlap(timeline) -> bool:
    for stage in range(timeline.num_stages):
        sends = sorted((e.start, e.end) for e in timeline.events
                       if e.stage == stage and e.stream.value == "send")
        if any(b[0] < a[1] for a, b in zip(sends, sends[1:])):
            return True
    return False


def test_a_shared_nic_serializes_a_stages_sends():
    """A V stage sends down (chunk 0) and up (chunk 1) at once: on one NIC those take
    turns (the testbed measured 1.5x the plan's time per transfer for the V schedules)."""
    schedule = make_schedule("zb-v", 4, 8)
    apart = simulate(schedule, PipelineCosts(forward=0.5, backward=1.0,
                                             activation_transfer=1.0))
    shared = simulate(schedule, PipelineCosts(forward=0.5, backward=1.0,
                                              activation_transfer=1.0, shared_nic=True))
    assert _sends_overlap(apart) and not _sends_overlap(shared)
    assert shared.iteration_time > apart.iteration_time
    for e in shared.events:
        if e.stream.value == "send":
            assert e.end - e.start == pytest.approx(1.0)

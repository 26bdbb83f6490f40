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
    s = Schedule.layout(n, 2, "v")
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


@pytest.mark.parametrize("name", ["zb-v", "eager-zb-v", "dualpipe-v"])
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
    chunks = 2 if name in ("zb-v", "eager-zb-v", "dualpipe-v") else 1
    costs = PipelineCosts(forward=1 / chunks, backward=2 / chunks, activation_transfer=transfer)
    t = simulate(make_schedule(name, n, m, **(options or {})), costs)
    return t.iteration_time, t.mean_bubble_fraction, max(t.peak_activations) / chunks


def test_zb_v_has_a_third_of_1f1bs_bubble_at_1f1bs_peak_memory():
    _, zb_bubble, zb_peak = _run("zb-v")
    _, bubble, peak = _run("1f1b")
    assert zb_bubble <= bubble / 3
    assert zb_peak <= peak


def test_transfer_aware_list_scheduling_gains_where_transfers_are_exposed():
    from reshard.pipeline.v_schedules import _list_scheduled_v

    for transfer in (0.5, 1.0):  # a chunk's forward is 0.5
        costs = PipelineCosts(forward=0.5, backward=1.0, activation_transfer=transfer)
        aware = simulate(_list_scheduled_v(4, 8, 8, 2 * transfer), costs).iteration_time
        plain = simulate(_list_scheduled_v(4, 8, 8, 0.0), costs).iteration_time
        assert aware < 0.9 * plain, (transfer, aware, plain)
    with pytest.raises(ScheduleError, match="transfer"):
        make_schedule("zb-v", 4, 8, transfer=-1)


@pytest.mark.parametrize("n, m", [(2, 4), (3, 6), (4, 8), (4, 16), (6, 12)])
def test_eager_zb_v_trades_memory_for_exposed_transfers(n, m):
    """Built for the transfer it meets, eager ZB-V is never slower than ZB-V built for
    it, holds at most eager 1F1B's first-stage peak (2n - 1 microbatches) on any stage,
    and is ZB-V with free transfers; at 4 stages, a transfer of a chunk's forward, it
    gains (the simulator's case for it)."""
    for transfer in (0.0, 0.25, 0.5, 1.0):  # a chunk's forward is 0.5
        zb = _run("zb-v", n, m, transfer, {"transfer": 2 * transfer})
        eager = _run("eager-zb-v", n, m, transfer, {"transfer": 2 * transfer})
        assert eager[0] <= zb[0] and eager[2] <= 2 * n - 1, (transfer, eager, zb)
        if not transfer:
            assert make_schedule("eager-zb-v", n, m, transfer=0) == make_schedule("zb-v", n, m)
    if (n, m) == (4, 8):
        assert _run("eager-zb-v", 4, 8, 0.5, {"transfer": 1.0})[0] < 0.95 * _run(
            "zb-v", 4, 8, 0.5, {"transfer": 1.0})[0]


@pytest.mark.parametrize("n, m", [(2, 4), (3, 6), (4, 8), (4, 12)])
def test_dualpipe_v_is_torchs_order(n, m):
    pytest.importorskip("torch")
    from reshard.pipeline.torch_orders import torch_schedule

    theirs = torch_schedule("dualpipe-v", n, m)
    validate(theirs)
    assert theirs == make_schedule("dualpipe-v", n, m)


@pytest.mark.parametrize("n, m", [(1, 2), (2, 2), (3, 6), (4, 5), (4, 8), (5, 11), (8, 16)])
def test_the_papers_zb_v_layout_is_torchs_order(n, m):
    pytest.importorskip("torch")
    from reshard.pipeline.torch_orders import torch_schedule
    from reshard.pipeline.v_schedules import _zb_v_phases

    theirs = torch_schedule("zb-v", n, m)
    validate(theirs)
    assert _zb_v_phases(n, m) == theirs


@pytest.mark.parametrize("n, m", [(2, 4), (3, 6), (4, 8), (4, 16), (6, 12), (8, 16)])
@pytest.mark.parametrize("transfer", [0.0, 0.25, 1.0])
def test_our_zb_v_is_no_slower_than_torchs(n, m, transfer):
    pytest.importorskip("torch")
    from reshard.pipeline.torch_orders import torch_schedule

    costs = PipelineCosts(forward=0.5, backward=1.0, activation_transfer=transfer)
    ours = simulate(make_schedule("zb-v", n, m, transfer=transfer / 0.5), costs)
    theirs = simulate(torch_schedule("zb-v", n, m), costs)
    assert ours.iteration_time <= theirs.iteration_time
    assert max(ours.peak_activations) <= 2 * n  # chunk activations: 1F1B's n stages' worth

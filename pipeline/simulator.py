"""Predicts the timeline of one iteration of a schedule from compute and transfer costs.

What the simulator models:

* each stage has one compute stream that runs its F/B/I/W actions back to back, in
  program order, each taking its cost from :class:`~reshard.pipeline.PipelineCosts`;
* transfers run on their own streams, overlapping compute. A send (SA/SG) is issued
  when the stage's program reaches it and costs the compute stream nothing; its
  transfer starts once it is issued, its data is ready (the producing action is
  done, which program order guarantees) and the previous transfer on the same link
  has finished: one transfer in flight per link (kind of data, sender,
  receiver; see :class:`~reshard.pipeline.Channel`), FIFO;
* the receiver's side is pre-posted: a transfer never waits for the receiving stage
  to reach its receive. A receive (RA/RG) blocks the compute stream until the
  transfer it matches has completed; it costs nothing if the data is already there.

With ``PipelineCosts(shared_nic=True)`` a stage's sends share one outbound link (its
host's NIC), FIFO in the order the stage issues them, instead of one link per channel.

What it does not model: contention between different links otherwise (each channel runs
at its own cost even when two share a NIC; with ``shared_nic``, receives from two
senders still do not share the receiver's NIC; a planner estimate covers contention
inside one transfer, not between transfers of different boundaries), memory limits, the time
to issue an operation or launch a kernel, compute slowed down by concurrent
communication, and jitter. A cost depends on the (virtual) stage or boundary, not
on the microbatch.
"""

from __future__ import annotations

from reshard.pipeline.actions import Action
from reshard.pipeline.costs import PipelineCosts
from reshard.pipeline.errors import ScheduleError
from reshard.pipeline.schedule import Channel, Schedule
from reshard.pipeline.timeline import Stream, Timeline, TimelineEvent
from reshard.pipeline.validate import check


def _on_wire(schedule: Schedule, costs: PipelineCosts, stage: int, action: Action,
             now: float, link_free: dict[Channel | int, float]) -> tuple[float, float]:
    """When a send's data is on the wire: from when both the stage and its link (its
    channel, or the stage's NIC with ``shared_nic``) are free, for its transfer time."""
    link = schedule.channel(stage, action)
    boundary = schedule.boundary(stage, action)
    assert link is not None and boundary is not None  # validated
    key: Channel | int = stage if costs.shared_nic else link
    start = max(now, link_free.get(key, 0.0))
    end = start + costs.transfer_time(action.kind, boundary)
    link_free[key] = end
    return start, end


def simulate(schedule: Schedule, costs: PipelineCosts | None = None) -> Timeline:
    """Simulates one iteration of a schedule.

    Args:
        schedule: The schedule; it is validated first.
        costs: Compute and transfer times; defaults to ``PipelineCosts()`` (forward
            1, backward 2, transfers free).

    Returns:
        The timeline, starting at time 0: per stage its compute events, and for each
        transfer a ``send`` event on the sender and a ``recv`` event on the receiver,
        both spanning the time the data is on the wire.

    Raises:
        ScheduleError: The schedule has a problem (see :func:`reshard.pipeline.check`)
            or a cost is missing or invalid.
    """
    check(schedule)
    costs = PipelineCosts() if costs is None else costs
    programs = schedule.stages
    clocks = [0.0] * schedule.num_stages
    link_free: dict[Channel | int, float] = {}  # per channel, or per stage (shared_nic)
    arrivals: dict[tuple[int, Action], tuple[float, float]] = {}
    events: list[list[TimelineEvent]] = [[] for _ in programs]

    def run(stage: int, action: Action) -> bool:
        now = clocks[stage]
        if action.kind.is_compute:
            virtual = schedule.virtual_stage(stage, action.chunk)
            end = now + costs.compute_time(action.kind, virtual)
            events[stage].append(TimelineEvent(stage, Stream.COMPUTE, str(action), now, end))
            clocks[stage] = end
        elif action.kind.is_send:
            start, end = _on_wire(schedule, costs, stage, action, now, link_free)
            events[stage].append(TimelineEvent(stage, Stream.SEND, str(action), start, end))
            arrivals[schedule.peer(stage, action)] = (start, end)  # type: ignore[index]
        else:
            arrival = arrivals.pop((stage, action), None)
            if arrival is None:
                return False
            start, end = arrival
            events[stage].append(TimelineEvent(stage, Stream.RECV, str(action), start, end))
            clocks[stage] = max(now, end)
        return True

    pcs = schedule.interpret(run)
    stuck = [s for s, program in enumerate(programs) if pcs[s] < len(program)]
    if stuck:  # check() rules this out; kept so a bug cannot return a partial timeline
        raise ScheduleError(f"simulation stalled on stages {stuck} at steps {pcs}")
    return Timeline(tuple(e for stage_events in events for e in stage_events), schedule.num_stages)

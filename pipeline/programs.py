"""What every schedule generator shares: checking its counts, 1F1B's per-stage order,
and writing a schedule's boundary transfers around its computations."""

from __future__ import annotations

from reshard.pipeline.actions import Action, ActionKind
from reshard.pipeline.errors import ScheduleError
from reshard.pipeline.schedule import Schedule

_F, _B, _I, _W = (
    ActionKind.FORWARD,
    ActionKind.BACKWARD,
    ActionKind.BACKWARD_INPUT,
    ActionKind.BACKWARD_WEIGHT,
)


def check_counts(**counts: int) -> None:
    """Refuse a count that is not an integer >= 1, naming it."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(f"{name} must be an integer >= 1, got {value!r}")


def one_f_one_b_order(n_mb: int, forwards_first: int) -> list[Action]:
    """Forwards first, then backward and forward in turn, then the rest of the backwards."""
    warmup = min(forwards_first, n_mb)
    order = [Action(_F, k) for k in range(warmup)]
    for k in range(n_mb):
        order.append(Action(_B, k))
        if warmup + k < n_mb:
            order.append(Action(_F, warmup + k))
    return order


def with_transfers(programs: list[list[Action]], n_mb: int, n_chunks: int,
                   placement: str = "interleaved") -> Schedule:
    """Adds the receive before, and the send after, each action that crosses a boundary."""
    bare = Schedule(tuple(tuple(p) for p in programs), n_mb, n_chunks, placement)
    stages = []
    for s, program in enumerate(bare.stages):
        full: list[Action] = []
        for action in program:
            if action.kind is _F:
                before, after = ActionKind.RECV_ACT, ActionKind.SEND_ACT
            elif action.kind in (_B, _I):
                before, after = ActionKind.RECV_GRAD, ActionKind.SEND_GRAD
            else:
                full.append(action)
                continue
            receive, send = action.with_kind(before), action.with_kind(after)
            full += [a for a in (receive,) if bare.peer(s, a) is not None]
            full.append(action)
            full += [a for a in (send,) if bare.peer(s, a) is not None]
        stages.append(tuple(full))
    return Schedule(tuple(stages), n_mb, n_chunks, placement)


__all__ = ["check_counts", "one_f_one_b_order", "with_transfers"]

"""Checks that a schedule is complete, respects data dependencies and cannot deadlock.

Execution model assumed by the deadlock check (the strictest a runtime may use, so a
schedule that passes runs under laxer ones too):

* compute actions (F, B, I, W) never wait for another stage;
* sends (SA, SG) are non-blocking: issuing one posts it to the stage's transfer
  stream and the program goes on;
* each link (one direction between two stages, one kind of data) is FIFO: a send
  completes only when its receive is reached, and sends on the link complete in the
  order they were issued;
* receives (RA, RG) block the stage until their send has been issued and every
  earlier send on the link has completed.

The check runs every stage's program counter as far as it can go; when none can
move and some are unfinished the schedule deadlocks, and the problem names the
blocked step of the lowest stage on the cycle of waits and describes the cycle.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from reshard.pipeline.actions import Action, ActionKind
from reshard.pipeline.errors import ScheduleError
from reshard.pipeline.schedule import Channel, Schedule

_F, _B, _I, _W = (
    ActionKind.FORWARD,
    ActionKind.BACKWARD,
    ActionKind.BACKWARD_INPUT,
    ActionKind.BACKWARD_WEIGHT,
)
_SA, _RA, _SG, _RG = (
    ActionKind.SEND_ACT,
    ActionKind.RECV_ACT,
    ActionKind.SEND_GRAD,
    ActionKind.RECV_GRAD,
)


class ProblemKind(enum.Enum):
    """The class of a schedule problem, in the order problems are reported."""

    INVALID = "invalid"
    """An action names a microbatch or chunk out of range, or a transfer without peer."""
    DUPLICATE = "duplicate"
    """An action appears more than once on a stage."""
    MISSING = "missing"
    """A stage lacks a forward, backward or boundary transfer it must run."""
    ORDER = "order"
    """A stage runs an action before one it depends on."""
    DEADLOCK = "deadlock"
    """The blocking receives wait on each other in a cycle."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a schedule.

    Attributes:
        kind: The class of problem.
        stage: The stage where it shows.
        step: The index in that stage's program of the offending action, or None
            when the action is missing.
        action: The offending (or missing) action.
        message: What is wrong, in words.
        related: Other ``(stage, step)`` cells involved (the earlier duplicate, the
            dependency that comes too late, the other steps of a deadlock cycle).
    """

    kind: ProblemKind
    stage: int
    step: int | None
    action: Action | None
    message: str
    related: tuple[tuple[int, int], ...] = ()

    @property
    def cells(self) -> tuple[tuple[int, int], ...]:
        """The ``(stage, step)`` cells to mark in a grid."""
        own = () if self.step is None else ((self.stage, self.step),)
        return own + self.related

    def __str__(self) -> str:
        where = f"stage {self.stage}"
        if self.step is not None:
            where += f" step {self.step}"
        if self.action is not None:
            where += f" ({self.action})"
        return f"{self.kind.value}: {where}: {self.message}"


def validate(schedule: Schedule) -> list[Problem]:
    """Every problem of a schedule; an empty list means it is sound.

    Args:
        schedule: The schedule to check.

    Returns:
        The problems, ordered by kind (invalid, duplicate, missing, order,
        deadlock), then stage, then step. The deadlock check runs only when there
        are no invalid, duplicate or missing actions.
    """
    problems: list[Problem] = []
    for stage in range(schedule.num_stages):
        problems += _stage_problems(schedule, stage)
    complete = not problems
    problems += _order_problems(schedule)
    if complete:
        deadlock = _deadlock(schedule)
        if deadlock is not None:
            problems.append(deadlock)
    rank = list(ProblemKind)
    problems.sort(key=lambda p: (rank.index(p.kind), p.stage, -1 if p.step is None else p.step))
    return problems


def check(schedule: Schedule) -> None:
    """Raises on the first problem :func:`validate` finds.

    Raises:
        ScheduleError: The message describes the first problem and shows the
            schedule's grid with its cells marked; ``problems`` holds them all.
    """
    problems = validate(schedule)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ScheduleError(
            f"{problems[0]}{more}\n{schedule.grid(marks=problems[0].cells)}",
            tuple(problems),
        )


def format_problems(schedule: Schedule, problems: Sequence[Problem]) -> str:
    """The problems, one per line, under the schedule's grid with every cell marked."""
    marks = [cell for p in problems for cell in p.cells]
    return "\n".join([schedule.grid(marks=marks), *map(str, problems)])


def _positions(program: Sequence[Action]) -> dict[Action, list[int]]:
    positions: dict[Action, list[int]] = {}
    for step, action in enumerate(program):
        positions.setdefault(action, []).append(step)
    return positions


def _stage_problems(schedule: Schedule, stage: int) -> list[Problem]:
    """Invalid, duplicated and missing actions on one stage."""
    program = schedule.stages[stage]
    problems = []
    for step, action in enumerate(program):
        message = None
        if action.microbatch >= schedule.num_microbatches:
            message = (
                f"microbatch {action.microbatch} is out of range; the schedule has "
                f"{schedule.num_microbatches} (0..{schedule.num_microbatches - 1})"
            )
        elif action.chunk >= schedule.num_chunks:
            message = (
                f"chunk {action.chunk} is out of range; stages have "
                f"{schedule.num_chunks} chunks (0..{schedule.num_chunks - 1})"
            )
        elif action.kind.is_transfer and schedule.peer(stage, action) is None:
            message = (
                f"{action} has no peer: virtual stage "
                f"{schedule.virtual_stage(stage, action.chunk)} has no "
                f"{'next' if action.kind in (_SA, _RG) else 'previous'} stage on "
                "another physical stage to transfer with"
            )
        if message is not None:
            problems.append(Problem(ProblemKind.INVALID, stage, step, action, message))
    positions = _positions(program)
    for action, steps in positions.items():
        if len(steps) > 1:
            problems.append(
                Problem(
                    ProblemKind.DUPLICATE, stage, steps[1], action,
                    f"{action} appears {len(steps)} times (steps "
                    f"{', '.join(map(str, steps))}); each action runs exactly once",
                    tuple((stage, s) for s in steps if s != steps[1]),
                )
            )
    for chunk in range(schedule.num_chunks):
        for mb in range(schedule.num_microbatches):
            problems += _missing(schedule, stage, chunk, mb, positions)
    return problems


def _missing(
    schedule: Schedule, stage: int, chunk: int, mb: int, positions: dict[Action, list[int]]
) -> list[Problem]:
    def missing(action: Action, message: str) -> Problem:
        return Problem(ProblemKind.MISSING, stage, None, action, message)

    def has(kind: ActionKind) -> bool:
        return Action(kind, mb, chunk) in positions

    where = f"microbatch {mb}" + (f" chunk {chunk}" if schedule.num_chunks > 1 else "")
    problems = []
    if not has(_F):
        problems.append(missing(Action(_F, mb, chunk), f"no forward of {where}"))
    if has(_B) and (has(_I) or has(_W)):
        split = Action(_I if has(_I) else _W, mb, chunk)
        problems.append(
            Problem(
                ProblemKind.DUPLICATE, stage, positions[split][0], split,
                f"the backward of {where} is given both as B and split into I/W",
                ((stage, positions[Action(_B, mb, chunk)][0]),),
            )
        )
    elif not has(_B):
        if not has(_I) and not has(_W):
            problems.append(
                missing(Action(_B, mb, chunk), f"no backward (B, or I and W) of {where}")
            )
        elif not has(_W):
            problems.append(
                missing(Action(_W, mb, chunk), f"{where} has I but no W (weight grad)")
            )
        elif not has(_I):
            problems.append(
                missing(Action(_I, mb, chunk), f"{where} has W but no I (input grad)")
            )
    for kind in (_RA, _SA, _RG, _SG):
        action = Action(kind, mb, chunk)
        if not has(kind) and schedule.peer(stage, action) is not None:
            peer_stage, peer_action = schedule.peer(stage, action)  # type: ignore[misc]
            problems.append(
                missing(action, f"no {action} to match {peer_action} on stage {peer_stage}")
            )
    return problems


def _dependencies(
    schedule: Schedule, stage: int, action: Action, program: Mapping[Action, int]
) -> list[tuple[Action, str]]:
    """What must come before ``action`` on its own stage (``program``), with the reason."""
    mb, chunk = action.microbatch, action.chunk
    kind = action.kind
    deps: list[tuple[Action, str]] = []

    def on(k: ActionKind, c: int = chunk) -> Action:
        return Action(k, mb, c)

    split = on(_I) in program
    grad_kind = _I if split else _B
    here = schedule.virtual_stage(stage, chunk)
    if kind is _F:
        if on(_RA) in program:
            deps.append((on(_RA), "receives its input activation"))
        elif here > 0 and schedule.locate(here - 1)[0] == stage:
            deps.append((on(_F, schedule.locate(here - 1)[1]), "produces its input locally"))
    elif kind in (_B, _I):
        deps.append((on(_F), "is its forward"))
        if on(_RG) in program:
            deps.append((on(_RG), "receives its output grad"))
        elif here + 1 < schedule.num_virtual_stages and schedule.locate(here + 1)[0] == stage:
            nxt = schedule.locate(here + 1)[1]
            next_grad = _I if on(_I, nxt) in program else _B
            deps.append((on(next_grad, nxt), "produces its output grad locally"))
    elif kind is _W:
        deps.append((on(_I), "computes the input grad first"))
    elif kind is _SA:
        deps.append((on(_F), "produces the activation"))
    elif kind is _SG:
        deps.append((on(grad_kind), "produces the input grad"))
    return deps


def _order_problems(schedule: Schedule) -> list[Problem]:
    problems = []
    for stage, program in enumerate(schedule.stages):
        step_of = {a: i for i, a in enumerate(program)}
        for step, action in enumerate(program):
            for dep, why in _dependencies(schedule, stage, action, step_of):
                dep_step = step_of.get(dep)
                if dep_step is not None and dep_step > step:
                    problems.append(
                        Problem(
                            ProblemKind.ORDER, stage, step, action,
                            f"{action} runs before {dep} (step {dep_step}), which {why}",
                            ((stage, dep_step),),
                        )
                    )
    return problems


def _deadlock(schedule: Schedule) -> Problem | None:
    """Runs the programs under the blocking model; a Problem if they get stuck."""
    programs = schedule.stages
    pending: dict[Channel, deque[tuple[int, Action]]] = {}

    def run(stage: int, action: Action) -> bool:
        channel = schedule.channel(stage, action)
        if channel is not None and action.kind.is_send:
            pending.setdefault(channel, deque()).append(schedule.peer(stage, action))  # type: ignore[arg-type]
        elif channel is not None:
            queue = pending.get(channel)
            if not queue or queue[0] != (stage, action):
                return False
            queue.popleft()
        return True

    pcs = schedule.interpret(run)
    blocked = [s for s in range(schedule.num_stages) if pcs[s] < len(programs[s])]
    if not blocked:
        return None
    return _describe_cycle(schedule, pcs, pending, blocked)


def _waits(schedule: Schedule, pcs: list[int],
           pending: dict[Channel, deque[tuple[int, Action]]],
           blocked: list[int]) -> dict[int, tuple[int, str, int]]:
    """Per blocked stage: the stage it waits on, why (in words), and that stage's step."""
    step_of = [{a: i for i, a in enumerate(p)} for p in schedule.stages]
    waits: dict[int, tuple[int, str, int]] = {}
    for stage in blocked:
        action = schedule.stages[stage][pcs[stage]]
        channel = schedule.channel(stage, action)
        assert channel is not None  # only receives block
        queue = pending.get(channel, deque())
        if (stage, action) in queue:
            head_stage, head = queue[0]
            sender, sent = schedule.peer(head_stage, head)  # type: ignore[misc]
            head_step = step_of[head_stage][head]
            why = (
                f"stage {stage} blocks at step {pcs[stage]} on {action}, but link "
                f"{channel} is FIFO and must first deliver the earlier {sent} from "
                f"stage {sender}, whose {head} stage {stage} reaches only at step "
                f"{head_step} (receives out of send order)"
            )
            waits[stage] = (stage, why, head_step)
        else:
            peer_stage, peer_action = schedule.peer(stage, action)  # type: ignore[misc]
            send_step = step_of[peer_stage][peer_action]
            why = (
                f"stage {stage} blocks at step {pcs[stage]} on {action}, waiting for "
                f"stage {peer_stage} to send {peer_action} at its step {send_step}"
            )
            waits[stage] = (peer_stage, why, send_step)
    return waits


def _describe_cycle(
    schedule: Schedule,
    pcs: list[int],
    pending: dict[Channel, deque[tuple[int, Action]]],
    blocked: list[int],
) -> Problem:
    waits = _waits(schedule, pcs, pending, blocked)
    # Every blocked stage waits on a blocked stage, so following waits from any
    # blocked stage ends in a cycle.
    seen: list[int] = []
    stage = blocked[0]
    while stage not in seen:
        seen.append(stage)
        stage = waits[stage][0]
    cycle = seen[seen.index(stage):]
    first = min(cycle)
    cycle = cycle[cycle.index(first):] + cycle[: cycle.index(first)]
    description = "; ".join(waits[s][1] for s in cycle)
    others = [s for s in blocked if s not in cycle]
    if others:
        description += "; also blocked: " + ", ".join(
            f"stage {s} at step {pcs[s]} ({schedule.stages[s][pcs[s]]})" for s in others
        )
    related = tuple(
        cell
        for s in cycle
        for cell in ((s, pcs[s]), (waits[s][0], waits[s][2]))
        if cell != (first, pcs[first])
    )
    return Problem(
        ProblemKind.DEADLOCK,
        first,
        pcs[first],
        schedule.stages[first][pcs[first]],
        "no stage can progress; cycle of waits: " + description,
        tuple(dict.fromkeys(related)),
    )

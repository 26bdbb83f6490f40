"""A pipeline schedule: per stage, the ordered actions that stage executes.

Text form (:meth:`Schedule.to_text` / :meth:`Schedule.from_text`), one line per
stage after a header line::

    microbatches=2 chunks=1
    stage 0: F0 SA0 F1 SA1 RG0 B0 RG1 B1
    stage 1: RA0 F0 B0 SG0 RA1 F1 B1 SG1

Actions follow the grammar of :mod:`reshard.pipeline.actions`. Blank lines and text
after ``#`` are ignored. The header is optional: without it the number of
microbatches and chunks is one more than the largest index used. Every stage from 0
to the last must have exactly one line (an empty line ``stage 3:`` is an empty
program).

Stage ``s``, chunk ``c`` is virtual stage ``c * num_stages + s`` (``placement=
interleaved``, Megatron's layout), or with ``placement=v`` (a V: ZB-V, DualPipeV) chunk
``c`` runs the stages down when ``c`` is even and back up when it is odd: ``c *
num_stages + (s if c % 2 == 0 else num_stages - 1 - s)``, so stage 0 holds the first
and the last virtual stage and the bottom of the V hands data over inside the last
stage. The header names a V placement (``placement=v``). Activations flow
from virtual stage ``v`` to ``v + 1`` and gradients back; the transfer between ``v``
and ``v + 1`` uses boundary index ``v``. Consecutive virtual stages on the same
physical stage (only with one stage and several chunks) hand data over locally,
without transfer actions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from reshard.pipeline.actions import Action, ActionKind
from reshard.pipeline.errors import ScheduleError

_PEER_KIND = {
    ActionKind.SEND_ACT: ActionKind.RECV_ACT,
    ActionKind.RECV_ACT: ActionKind.SEND_ACT,
    ActionKind.SEND_GRAD: ActionKind.RECV_GRAD,
    ActionKind.RECV_GRAD: ActionKind.SEND_GRAD,
}
# Which way along the virtual stages the data of a transfer action travels from
# this stage to its peer: +1 downstream, -1 upstream.
_PEER_STEP = {
    ActionKind.SEND_ACT: 1,
    ActionKind.RECV_ACT: -1,
    ActionKind.SEND_GRAD: -1,
    ActionKind.RECV_GRAD: 1,
}
_STAGE_LINE = re.compile(r"stage\s+(\d+)\s*:(.*)")
_HEADER_FIELD = re.compile(r"(microbatches|chunks)=(\d+)|placement=(interleaved|v)")
PLACEMENTS = ("interleaved", "v")
"""How chunks map to virtual stages (module docstring)."""


@dataclass(frozen=True)
class Channel:
    """A one-way link that transfers of one kind use, FIFO, between two stages.

    Attributes:
        send_kind: ``SEND_ACT`` (activations, downstream) or ``SEND_GRAD``
            (gradients, upstream).
        src: The sending stage.
        dst: The receiving stage.
    """

    send_kind: ActionKind
    src: int
    dst: int

    def __str__(self) -> str:
        what = "activations" if self.send_kind is ActionKind.SEND_ACT else "gradients"
        return f"{what} {self.src}->{self.dst}"


@dataclass(frozen=True)
class Schedule:
    """Per stage, the ordered actions it executes.

    The constructor checks only the shape of the value (types, counts); whether the
    schedule is complete and runs without deadlock is :func:`reshard.pipeline.validate`'s
    job, so that broken schedules can be built and diagnosed.

    Attributes:
        stages: ``stages[s]`` is the program of stage ``s``. Lists and action text are
            accepted and stored as tuples of :class:`Action`.
        num_microbatches: Microbatches per iteration (>= 1).
        num_chunks: Model chunks per stage (>= 1; > 1 for interleaved and V schedules).
        placement: ``"interleaved"`` or ``"v"`` (module docstring).
    """

    stages: tuple[tuple[Action, ...], ...]
    num_microbatches: int
    num_chunks: int = 1
    placement: str = "interleaved"

    def __post_init__(self) -> None:
        if isinstance(self.stages, str | bytes) or not isinstance(self.stages, Sequence):
            raise ScheduleError(
                f"stages must be a sequence of per-stage action sequences, got {self.stages!r}"
            )
        stages = tuple(
            tuple(a if isinstance(a, Action) else Action.parse(a) for a in _program(s, i))
            for i, s in enumerate(self.stages)
        )
        if not stages:
            raise ScheduleError("a schedule needs at least one stage, got none")
        object.__setattr__(self, "stages", stages)
        for field in ("num_microbatches", "num_chunks"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ScheduleError(f"{field} must be an integer >= 1, got {value!r}")
        if self.placement not in PLACEMENTS:
            raise ScheduleError(f"placement must be one of {', '.join(PLACEMENTS)}, got "
                                f"{self.placement!r}")

    @classmethod
    def from_lists(
        cls,
        stages: Sequence[Sequence[Action | str]],
        num_microbatches: int | None = None,
        num_chunks: int | None = None,
        placement: str = "interleaved",
    ) -> Schedule:
        """Builds a schedule, inferring the counts that are not given.

        Args:
            stages: Per stage, its actions (objects or text such as ``"F3"``).
            num_microbatches: Defaults to one more than the largest microbatch used.
            num_chunks: Defaults to one more than the largest chunk used.
            placement: How chunks map to virtual stages (module docstring).

        Returns:
            The schedule.
        """
        programs = [
            [a if isinstance(a, Action) else Action.parse(a) for a in _program(s, i)]
            for i, s in enumerate(stages)
        ]
        actions = [a for p in programs for a in p]
        if num_microbatches is None:
            num_microbatches = 1 + max((a.microbatch for a in actions), default=0)
        if num_chunks is None:
            num_chunks = 1 + max((a.chunk for a in actions), default=0)
        return cls(tuple(tuple(p) for p in programs), num_microbatches, num_chunks, placement)

    @classmethod
    def layout(cls, num_stages: int, num_chunks: int = 1,
               placement: str = "interleaved") -> Schedule:
        """A schedule of empty programs: its stage, chunk and virtual-stage mapping
        (:meth:`virtual_stage`, :meth:`locate`, :meth:`peer`) without actions."""
        return cls(tuple(() for _ in range(num_stages)), 1, num_chunks, placement)

    @property
    def num_stages(self) -> int:
        """Number of (physical) stages."""
        return len(self.stages)

    @property
    def num_virtual_stages(self) -> int:
        """Number of model pieces: stages times chunks."""
        return self.num_stages * self.num_chunks

    def virtual_stage(self, stage: int, chunk: int) -> int:
        """The virtual stage index of ``chunk`` on ``stage``."""
        n = self.num_stages
        if self.placement == "v" and chunk % 2:
            return chunk * n + n - 1 - stage
        return chunk * n + stage

    def locate(self, virtual_stage: int) -> tuple[int, int]:
        """The ``(stage, chunk)`` that holds a virtual stage."""
        chunk, offset = divmod(virtual_stage, self.num_stages)
        if self.placement == "v" and chunk % 2:
            return self.num_stages - 1 - offset, chunk
        return offset, chunk

    def peer(self, stage: int, action: Action) -> tuple[int, Action] | None:
        """The action on another stage that a transfer action pairs with.

        Args:
            stage: The stage the action is on.
            action: A send or receive.

        Returns:
            ``(peer_stage, peer_action)``, e.g. ``(1, RA3)`` for ``SA3`` on stage 0,
            or None when the action has no peer: a compute action, a transfer off
            either end of the pipeline, or one between virtual stages that share a
            physical stage (those hand data over locally).
        """
        if not action.kind.is_transfer:
            return None
        other = self.virtual_stage(stage, action.chunk) + _PEER_STEP[action.kind]
        if not 0 <= other < self.num_virtual_stages:
            return None
        peer_stage, peer_chunk = self.locate(other)
        if peer_stage == stage:
            return None
        return peer_stage, Action(_PEER_KIND[action.kind], action.microbatch, peer_chunk)

    def channel(self, stage: int, action: Action) -> Channel | None:
        """The FIFO link a transfer action uses, or None when it has no peer."""
        found = self.peer(stage, action)
        if found is None:
            return None
        peer_stage = found[0]
        if action.kind.is_send:
            return Channel(action.kind, stage, peer_stage)
        return Channel(_PEER_KIND[action.kind], peer_stage, stage)

    def boundary(self, stage: int, action: Action) -> int | None:
        """The boundary index of a transfer action (the lower of the two virtual stages)."""
        if self.peer(stage, action) is None:
            return None
        here = self.virtual_stage(stage, action.chunk)
        return min(here, here + _PEER_STEP[action.kind])

    def to_text(self) -> str:
        """The text form; :meth:`from_text` reads it back to an equal schedule."""
        lines = [f"microbatches={self.num_microbatches} chunks={self.num_chunks}"
                 + (f" placement={self.placement}" if self.placement != "interleaved" else "")]
        for s, program in enumerate(self.stages):
            lines.append(f"stage {s}: " + " ".join(map(str, program)))
        return "\n".join(line.rstrip() for line in lines) + "\n"

    @classmethod
    def from_text(cls, text: str) -> Schedule:
        """Reads the text form written by :meth:`to_text` (see the module docstring).

        Raises:
            ScheduleError: A line is neither a header nor ``stage N: actions``, an
                action is malformed, or stages are missing or repeated.
        """
        programs: dict[int, list[Action]] = {}
        counts: dict[str, int] = {}
        placement = "interleaved"
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            stage_match = _STAGE_LINE.fullmatch(line)
            if stage_match is not None:
                stage = int(stage_match.group(1))
                if stage in programs:
                    raise ScheduleError(f"line {number}: stage {stage} is given twice")
                try:
                    programs[stage] = [Action.parse(t) for t in stage_match.group(2).split()]
                except ScheduleError as err:
                    raise ScheduleError(f"line {number}: {err}") from None
                continue
            fields = line.split()
            if programs or not all(_HEADER_FIELD.fullmatch(f) for f in fields):
                raise ScheduleError(
                    f"line {number}: expected 'stage N: <actions>' or, on the first "
                    f"line, a header 'microbatches=M chunks=C [placement=v]', got {raw!r}"
                )
            for f in fields:
                key, value = f.split("=")
                if key == "placement":
                    placement = value
                else:
                    counts[key] = int(value)
        if not programs:
            raise ScheduleError("schedule text has no 'stage N: ...' lines")
        expected = list(range(max(programs) + 1))
        if sorted(programs) != expected:
            missing = sorted(set(expected) - set(programs))
            raise ScheduleError(f"schedule text lacks stages {missing}; stages must be 0..N-1")
        return cls.from_lists(
            [programs[s] for s in expected], counts.get("microbatches"), counts.get("chunks"),
            placement,
        )

    def grid(self, marks: Collection[tuple[int, int]] = ()) -> str:
        """A printable table: one row per stage, one column per step (program index).

        Args:
            marks: ``(stage, step)`` cells to highlight; they print as ``>F3<``.

        Returns:
            The table, rows separated by newlines.
        """
        marked = set(marks)
        longest = max((len(str(a)) for p in self.stages for a in p), default=2)
        width = longest + (2 if marked else 0)
        num_steps = max(len(p) for p in self.stages)
        label = max(len("step"), len(f"stage {self.num_stages - 1}"))
        rows = ["step".ljust(label) + " " + " ".join(f"{i:<{width}}" for i in range(num_steps))]
        for s, program in enumerate(self.stages):
            cells = []
            for i, action in enumerate(program):
                text = f">{action}<" if (s, i) in marked else str(action)
                cells.append(f"{text:<{width}}")
            rows.append(f"stage {s}".ljust(label) + " " + " ".join(cells))
        return "\n".join(r.rstrip() for r in rows)

    def interpret(self, run: Callable[[int, Action], bool]) -> list[int]:
        """Run every stage's program round-robin under the blocking model: ``run(stage,
        action)`` runs an action or says it blocks (False); a stage goes on until it
        blocks or ends, and the rounds go on until no stage moves. Returns each
        stage's position (its program's length where it ended)."""
        pcs = [0] * self.num_stages
        moved = True
        while moved:
            moved = False
            for stage, program in enumerate(self.stages):
                while pcs[stage] < len(program) and run(stage, program[pcs[stage]]):
                    pcs[stage] += 1
                    moved = True
        return pcs

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"Schedule.from_text({self.to_text()!r})"


def _program(program: object, stage: int) -> Sequence[object]:
    if isinstance(program, str | bytes) or not isinstance(program, Sequence):
        raise ScheduleError(
            f"stage {stage}: a program must be a sequence of actions, got {program!r}"
        )
    return program

"""Pipeline actions: the instructions a stage executes, and their text form.

Text grammar (one token per action, no spaces)::

    action     := KIND MICROBATCH [ "@" CHUNK ]
    KIND       := "F" | "B" | "I" | "W" | "SA" | "RA" | "SG" | "RG"
    MICROBATCH := decimal integer >= 0
    CHUNK      := decimal integer >= 0   (model chunk on this stage; default 0)

==== ============================================================================
Kind Meaning
==== ============================================================================
F    forward of the microbatch
B    full backward (input grad and weight grad together)
I    backward for the input grad only (zero-bubble split); sends the grad upstream
W    backward for the weight grad only; must follow the I of the same microbatch
SA   send the activation this chunk produced to the next (virtual) stage
RA   receive this chunk's input activation from the previous (virtual) stage
SG   send the input grad this chunk produced to the previous (virtual) stage
RG   receive this chunk's output grad from the next (virtual) stage
==== ============================================================================

Examples: ``F3`` (forward of microbatch 3), ``B0@1`` (backward of microbatch 0 on
model chunk 1 of an interleaved schedule), ``SA2`` (send the activation of
microbatch 2 downstream), ``RG5@1``. The stage is not part of an action: it is the
row of the :class:`~reshard.pipeline.Schedule` the action sits in. The chunk suffix
is omitted for chunk 0 (``F3@0`` is accepted and reads as ``F3``), so
``Action.parse(str(a)) == a`` for every action and ``str(Action.parse(t))`` is the
canonical spelling of ``t``.

A chunk ``c`` on stage ``s`` of a schedule with ``S`` stages is virtual stage
``c * S + s`` (Megatron's interleaved layout); transfer actions name the chunk on
their own stage: ``SA3@0`` on the last stage is matched by ``RA3@1`` on stage 0.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from reshard.pipeline.errors import ScheduleError


class ActionKind(enum.Enum):
    """What an action does; the value is its text code."""

    FORWARD = "F"
    BACKWARD = "B"
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"
    SEND_ACT = "SA"
    RECV_ACT = "RA"
    SEND_GRAD = "SG"
    RECV_GRAD = "RG"

    @property
    def is_compute(self) -> bool:
        """True for F, B, I and W: work on the compute stream."""
        return self in _COMPUTE

    @property
    def is_send(self) -> bool:
        """True for SA and SG: non-blocking, posted to the transfer stream."""
        return self in (ActionKind.SEND_ACT, ActionKind.SEND_GRAD)

    @property
    def is_recv(self) -> bool:
        """True for RA and RG: block the stage until the data has arrived."""
        return self in (ActionKind.RECV_ACT, ActionKind.RECV_GRAD)

    @property
    def is_transfer(self) -> bool:
        """True for sends and receives."""
        return not self.is_compute


_COMPUTE = frozenset(
    {
        ActionKind.FORWARD,
        ActionKind.BACKWARD,
        ActionKind.BACKWARD_INPUT,
        ActionKind.BACKWARD_WEIGHT,
    }
)

# Longest codes first so that "SA" is not read as "S" + "A".
_CODES = "|".join(sorted((k.value for k in ActionKind), key=len, reverse=True))
_ACTION_RE = re.compile(rf"({_CODES})(\d+)(?:@(\d+))?")
VALID_FORMS = (
    "<KIND><microbatch>[@<chunk>] with KIND one of "
    + ", ".join(k.value for k in ActionKind)
    + " (e.g. F3, B0@1, I2, W2, SA2, RA2, SG5@1, RG5@1)"
)


@dataclass(frozen=True)
class Action:
    """One instruction of a pipeline stage.

    Attributes:
        kind: What the action does.
        microbatch: The microbatch it applies to (>= 0).
        chunk: The model chunk on this stage (>= 0; only interleaved schedules use
            chunks other than 0).
    """

    kind: ActionKind
    microbatch: int
    chunk: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ActionKind):
            raise ScheduleError(
                f"action kind must be an ActionKind, got {self.kind!r}; valid: "
                + ", ".join(k.name for k in ActionKind)
            )
        for field, value in (("microbatch", self.microbatch), ("chunk", self.chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ScheduleError(
                    f"action {field} must be an integer >= 0, got {value!r}"
                )

    @classmethod
    def parse(cls, text: object) -> Action:
        """Reads one action token, e.g. ``"F3"``, ``"B0@1"`` or ``"SA2"``.

        Args:
            text: The token; surrounding whitespace is ignored.

        Returns:
            The action.

        Raises:
            ScheduleError: The token does not follow the grammar; the message names
                it and lists the valid forms.
        """
        if not isinstance(text, str):
            raise ScheduleError(f"action text must be a str, got {text!r}")
        match = _ACTION_RE.fullmatch(text.strip())
        if match is None:
            raise ScheduleError(f"bad action {text!r}: expected {VALID_FORMS}")
        code, microbatch, chunk = match.groups()
        return cls(ActionKind(code), int(microbatch), int(chunk) if chunk else 0)

    def __str__(self) -> str:
        suffix = f"@{self.chunk}" if self.chunk else ""
        return f"{self.kind.value}{self.microbatch}{suffix}"

    def __repr__(self) -> str:
        return f"Action.parse({str(self)!r})"

    def with_kind(self, kind: ActionKind) -> Action:
        """The action of another kind on the same microbatch and chunk."""
        return Action(kind, self.microbatch, self.chunk)

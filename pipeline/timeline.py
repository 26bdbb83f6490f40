"""Timelines of a pipeline iteration: simulated or measured, summarised and plotted alike.

A :class:`Timeline` is built from :class:`TimelineEvent` values, whoever produced
them: :func:`reshard.pipeline.simulate` predicts them, a runtime records them. Every
statistic (iteration time, bubbles, activations in flight) is derived from the events,
so a measured and a simulated timeline of the same schedule compare field by field and
plot the same way.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from reshard.core.choice import parse_choice
from reshard.core.errors import ReshardError
from reshard.pipeline.actions import Action, ActionKind
from reshard.pipeline.errors import ScheduleError


class Stream(enum.Enum):
    """Where on a stage an event runs."""

    COMPUTE = "compute"
    SEND = "send"
    RECV = "recv"

    @classmethod
    def parse(cls, value: Stream | str) -> Stream:
        """Reads a stream name (``"compute"``, ``"send"`` or ``"recv"``) with
        :func:`reshard.core.choice.parse_choice`; a :class:`ScheduleError` listing the valid
        names otherwise."""
        try:
            return parse_choice(cls, value, "stream")
        except ReshardError as e:
            raise ScheduleError(str(e)) from None


@dataclass(frozen=True)
class TimelineEvent:
    """One interval of work on one stream of one stage.

    Attributes:
        stage: The stage it ran on.
        stream: ``compute`` for F/B/I/W; ``send`` / ``recv`` for the two ends of a
            transfer (a string is accepted and parsed).
        action: The action text, e.g. ``"F3"`` or ``"SA3@1"`` (see
            :mod:`reshard.pipeline.actions`); other labels are kept but not counted
            as forwards or backwards.
        start: Start time in seconds.
        end: End time in seconds (>= start).
    """

    stage: int
    stream: Stream
    action: str
    start: float
    end: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "stream", Stream.parse(self.stream))
        if isinstance(self.stage, bool) or not isinstance(self.stage, int) or self.stage < 0:
            raise ScheduleError(f"event stage must be an integer >= 0, got {self.stage!r}")
        start, end = float(self.start), float(self.end)
        if not (math.isfinite(start) and math.isfinite(end)) or end < start:
            raise ScheduleError(
                f"event {self.action!r} on stage {self.stage} must have finite "
                f"start <= end, got start={self.start!r} end={self.end!r}"
            )
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "end", end)

    @property
    def duration(self) -> float:
        """``end - start``."""
        return self.end - self.start

    def parsed_action(self) -> Action | None:
        """The event's action, or None when its label is not action text."""
        try:
            return Action.parse(self.action)
        except ScheduleError:
            return None


@dataclass(frozen=True)
class Timeline:
    """The events of one pipeline iteration and what follows from them.

    Times are relative to the earliest event start, so recorded wall-clock times can
    be passed as they are.

    Attributes:
        events: The events, in the order given (for one stage, program order).
        num_stages: Number of stages; defaults to one more than the largest stage
            that has an event.
    """

    events: tuple[TimelineEvent, ...]
    num_stages: int = 0

    def __post_init__(self) -> None:
        events = tuple(
            e if isinstance(e, TimelineEvent) else TimelineEvent(**e) for e in self.events
        )
        object.__setattr__(self, "events", events)
        needed = 1 + max((e.stage for e in events), default=-1)
        if not self.num_stages:
            object.__setattr__(self, "num_stages", needed)
        elif self.num_stages < needed:
            raise ScheduleError(
                f"timeline has events on stage {needed - 1} but num_stages={self.num_stages}"
            )

    @classmethod
    def from_records(
        cls, records: Iterable[Mapping[str, Any]], num_stages: int = 0
    ) -> Timeline:
        """Builds a timeline from dicts with keys stage, stream, action, start, end."""
        return cls(tuple(TimelineEvent(**dict(r)) for r in records), num_stages)

    def to_records(self) -> list[dict[str, Any]]:
        """The events as JSON-ready dicts; :meth:`from_records` reads them back."""
        return [
            {"stage": e.stage, "stream": e.stream.value, "action": e.action,
             "start": e.start, "end": e.end}
            for e in self.events
        ]

    @property
    def origin(self) -> float:
        """The earliest event start (0 for an empty timeline)."""
        return min((e.start for e in self.events), default=0.0)

    @cached_property
    def iteration_time(self) -> float:
        """From the first event start to the last event end, transfers included."""
        return max((e.end for e in self.events), default=0.0) - self.origin

    def busy_time(self, stage: int) -> float:
        """Time the compute stream of ``stage`` is busy (overlapping events counted once)."""
        intervals = sorted(
            (e.start, e.end)
            for e in self.events
            if e.stage == stage and e.stream is Stream.COMPUTE
        )
        busy, reach = 0.0, -math.inf
        for start, end in intervals:
            if end > reach:
                busy += end - max(start, reach)
                reach = end
        return busy

    @cached_property
    def bubble_fraction(self) -> tuple[float, ...]:
        """Per stage, idle compute time over iteration time."""
        total = self.iteration_time
        if total <= 0:
            return tuple(0.0 for _ in range(self.num_stages))
        return tuple(1 - self.busy_time(s) / total for s in range(self.num_stages))

    @property
    def mean_bubble_fraction(self) -> float:
        """Bubble fraction averaged over stages."""
        fractions = self.bubble_fraction
        return sum(fractions) / len(fractions) if fractions else 0.0

    @cached_property
    def peak_activations(self) -> tuple[int, ...]:
        """Per stage, the most forwards done whose backward has not completed.

        A forward counts from its end; its backward completes at the end of B, or of
        W when the backward is split into I and W. With several chunks per stage one
        unit is one chunk's activations. Counts follow event end times (ties in event
        order).
        """
        peaks = []
        for stage in range(self.num_stages):
            deltas = []
            for e in self.events:
                if e.stage != stage or e.stream is not Stream.COMPUTE:
                    continue
                action = e.parsed_action()
                if action is None:
                    continue
                if action.kind is ActionKind.FORWARD:
                    deltas.append((e.end, 1))
                elif action.kind in (ActionKind.BACKWARD, ActionKind.BACKWARD_WEIGHT):
                    deltas.append((e.end, -1))
            live = peak = 0
            for _, delta in sorted(deltas, key=lambda d: d[0]):
                live += delta
                peak = max(peak, live)
            peaks.append(peak)
        return tuple(peaks)

    def events_on(self, stage: int, stream: Stream | str | None = None) -> tuple[TimelineEvent, ...]:
        """The events of one stage, optionally of one stream, in the order given."""
        wanted = None if stream is None else Stream.parse(stream)
        return tuple(
            e for e in self.events if e.stage == stage and (wanted is None or e.stream is wanted)
        )

    def summary(self) -> str:
        """A few lines: iteration time, and per stage its bubble fraction and peak activations."""
        lines = [f"iteration time {self.iteration_time:.6g}"]
        for s in range(self.num_stages):
            lines.append(
                f"stage {s}: bubble {self.bubble_fraction[s]:.1%}, "
                f"peak activations {self.peak_activations[s]}"
            )
        return "\n".join(lines)

    def to_ascii(self, unit: float = 1.0) -> str:
        """The compute streams as text, one row per stage and one cell per ``unit`` of time.

        A cell shows the compute action running at the middle of its time slot, or
        ``.`` when the stage is idle. Meant for costs that are multiples of ``unit``.

        Args:
            unit: Time per cell (> 0).

        Returns:
            The rows, separated by newlines.
        """
        if not unit > 0:
            raise ScheduleError(f"unit must be > 0, got {unit!r}")
        origin = self.origin
        cells = math.ceil(self.iteration_time / unit - 1e-9)
        compute = [e for e in self.events if e.stream is Stream.COMPUTE]
        width = max((len(e.action) for e in compute), default=1)
        rows = []
        for stage in range(self.num_stages):
            row = ["." * width] * cells
            for e in compute:
                if e.stage != stage:
                    continue
                first = math.ceil((e.start - origin) / unit - 0.5 - 1e-9)
                last = math.ceil((e.end - origin) / unit - 0.5 - 1e-9)
                for i in range(max(first, 0), min(last, cells)):
                    row[i] = e.action.ljust(width)
            rows.append(f"{stage}: " + " ".join(row).rstrip())
        return "\n".join(rows)

    def plot(self, path: str | Path, title: str | None = None) -> Path:
        """Draws a Gantt chart of every stream to a PNG file.

        Per stage, the compute stream is the tall bar row; sends and receives are
        the two thin rows beneath it. Needs matplotlib (imported here; the Agg
        canvas is used directly, so no display and no global backend change).

        Args:
            path: Where to write the PNG.
            title: Chart title; defaults to the iteration time.

        Returns:
            The path written.
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch

        path = Path(path)
        total = max(self.iteration_time, 1e-12)
        figure = Figure(figsize=(max(8.0, min(24.0, 0.25 * len(self.events) ** 0.8)),
                                 1.0 + 0.9 * max(self.num_stages, 1)))
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        lanes = {Stream.COMPUTE: (0.05, 0.5), Stream.SEND: (0.58, 0.16), Stream.RECV: (0.77, 0.16)}
        origin = self.origin
        for e in self.events:
            offset, height = lanes[e.stream]
            action = e.parsed_action()
            color = _COLORS.get(action.kind if action else None, "#999999")
            axes.broken_barh(
                [(e.start - origin, max(e.duration, total * 1e-4))],
                (e.stage + offset, height),
                facecolors=color, edgecolors="black", linewidth=0.3,
            )
            if e.stream is Stream.COMPUTE and e.duration > total / 60:
                label = e.action[1:] if action else e.action
                axes.text(e.start - origin + e.duration / 2, e.stage + offset + height / 2,
                          label, ha="center", va="center", fontsize=7)
        axes.set_ylim(self.num_stages, 0)
        axes.set_xlim(0, total)
        axes.set_yticks([s + 0.3 for s in range(self.num_stages)])
        axes.set_yticklabels([f"stage {s}" for s in range(self.num_stages)])
        axes.set_xlabel("time (s)")
        axes.set_title(title or f"iteration time {self.iteration_time:.4g}")
        kinds = sorted({a.kind for e in self.events if (a := e.parsed_action())},
                       key=lambda k: list(ActionKind).index(k))
        axes.legend(handles=[Patch(color=_COLORS[k], label=k.name.lower()) for k in kinds],
                    loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
        figure.tight_layout()
        figure.savefig(path, dpi=120)
        return path


_COLORS: dict[ActionKind | None, str] = {
    ActionKind.FORWARD: "#4e79a7",
    ActionKind.BACKWARD: "#59a14f",
    ActionKind.BACKWARD_INPUT: "#8cd17d",
    ActionKind.BACKWARD_WEIGHT: "#b6992d",
    ActionKind.SEND_ACT: "#f28e2b",
    ActionKind.RECV_ACT: "#ffbe7d",
    ActionKind.SEND_GRAD: "#e15759",
    ActionKind.RECV_GRAD: "#ff9d9a",
}


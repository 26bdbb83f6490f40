"""The shipped schedule generators and the registry that names them (the schedule IR
they build is :mod:`reshard.pipeline.schedule`).

Every generator takes the number of stages ``n_stages`` and of microbatches ``n_mb``
(each >= 1, else :class:`~reshard.pipeline.ScheduleError`; a generator's Args name
only what else it takes or needs) and returns a :class:`~reshard.pipeline.Schedule`
with the boundary transfers written out: on a stage, a forward ``F k`` is preceded
by the receive of its input (``RA k``, unless it is the first virtual stage) and
followed by the send of its output (``SA k``, unless it is the last); a backward
(``B k``, or ``I k`` when split) is preceded by ``RG k`` and followed by ``SG k``.
Sends are issued right after the data is produced (they do not block), receives
right before the data is used (they block), so every transfer overlaps whatever the
receiver does meanwhile.

The timelines in the docstrings are :meth:`~reshard.pipeline.Timeline.to_ascii`
renderings of :func:`~reshard.pipeline.simulate` with the costs each one names and
free transfers: one row per stage, one column per time unit, ``..`` when idle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from reshard.pipeline.actions import Action, ActionKind
from reshard.pipeline.errors import ScheduleError
from reshard.pipeline.programs import check_counts, one_f_one_b_order, with_transfers
from reshard.pipeline.schedule import Schedule
from reshard.pipeline.v_schedules import (
    V_CANDIDATES,
    dualpipe_v,
    eager_zero_bubble_v,
    zero_bubble_v,
)

_F, _B, _I, _W = (
    ActionKind.FORWARD,
    ActionKind.BACKWARD,
    ActionKind.BACKWARD_INPUT,
    ActionKind.BACKWARD_WEIGHT,
)


def gpipe(n_stages: int, n_mb: int) -> Schedule:
    """GPipe: every stage runs all forwards, then all backwards.

    Peak activations: every microbatch on every stage.

    Timeline (4 stages, 8 microbatches; F=1, B=1)::

        0: F0 F1 F2 F3 F4 F5 F6 F7 .. .. .. .. .. .. B0 B1 B2 B3 B4 B5 B6 B7
        1: .. F0 F1 F2 F3 F4 F5 F6 F7 .. .. .. .. B0 B1 B2 B3 B4 B5 B6 B7 ..
        2: .. .. F0 F1 F2 F3 F4 F5 F6 F7 .. .. B0 B1 B2 B3 B4 B5 B6 B7 .. ..
        3: .. .. .. F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7 .. .. ..
    """
    check_counts(n_stages=n_stages, n_mb=n_mb)
    order = [Action(_F, k) for k in range(n_mb)] + [Action(_B, k) for k in range(n_mb)]
    return with_transfers([order] * n_stages, n_mb, 1)


def one_f_one_b(n_stages: int, n_mb: int) -> Schedule:
    """1F1B (PipeDream-flush / Megatron): warm up, then alternate backward and forward.

    Stage ``i`` runs ``min(n_stages - i, n_mb)`` forwards before its first backward,
    then one backward and one forward in turn, then the remaining backwards. At most
    ``n_stages - i`` activations are in flight on stage ``i``.

    Timeline (4 stages, 8 microbatches; F=1, B=1)::

        0: F0 F1 F2 F3 .. .. .. B0 F4 B1 F5 B2 F6 B3 F7 B4 .. B5 .. B6 .. B7
        1: .. F0 F1 F2 .. .. B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 .. B6 .. B7 ..
        2: .. .. F0 F1 .. B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 .. B7 .. ..
        3: .. .. .. F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 .. .. ..
    """
    check_counts(n_stages=n_stages, n_mb=n_mb)
    return with_transfers(
        [one_f_one_b_order(n_mb, n_stages - i) for i in range(n_stages)], n_mb, 1
    )


def eager_one_f_one_b(n_stages: int, n_mb: int) -> Schedule:
    """Eager 1F1B, the overlapping-friendly schedule of Zhuang et al. (MLSys 2023).

    Like 1F1B, but stage ``i`` runs up to ``2 * (n_stages - i) - 1`` forwards before its
    first backward (capped by ``n_mb``). Each forward's output is then produced a step
    before the next stage needs it, so its transfer has that step of slack to hide
    behind compute. The price is memory: up to ``2 * (n_stages - i) - 1`` activations in
    flight on stage ``i`` instead of ``n_stages - i``. With free transfers it takes as
    long as 1F1B.

    Timeline (4 stages, 8 microbatches; F=1, B=1)::

        0: F0 F1 F2 F3 F4 F5 F6 B0 F7 B1 .. B2 .. B3 .. B4 .. B5 .. B6 .. B7
        1: .. F0 F1 F2 F3 F4 B0 F5 B1 F6 B2 F7 B3 .. B4 .. B5 .. B6 .. B7 ..
        2: .. .. F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 .. B6 .. B7 .. ..
        3: .. .. .. F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 .. .. ..
    """
    check_counts(n_stages=n_stages, n_mb=n_mb)
    return with_transfers(
        [one_f_one_b_order(n_mb, 2 * (n_stages - i) - 1) for i in range(n_stages)], n_mb, 1
    )


def interleaved_one_f_one_b(n_stages: int, n_mb: int, n_chunks: int = 2) -> Schedule:
    """Interleaved 1F1B with virtual stages (Megatron-LM, Narayanan et al. 2021).

    Each stage holds ``n_chunks`` model chunks; chunk ``c`` of stage ``s`` is virtual
    stage ``c * n_stages + s``, so data visits every stage ``n_chunks`` times and the
    last stage sends back to stage 0. Microbatches go in groups of ``G = n_stages``: a
    group runs through chunk 0, then chunk 1, and so on (backwards through the chunks
    in reverse). Stage ``s`` warms up with ``2 * (n_stages - s - 1) + (n_chunks - 1) *
    G`` chunk-forwards (capped by the total), then alternates one forward and one
    backward, then drains the backwards. Bubbles shrink about ``n_chunks``-fold for
    the price of ``n_chunks`` times more transfers. When ``n_mb`` is not a multiple of
    ``n_stages`` the remainder is spread over the groups (sizes differ by at most one,
    the first ``G`` is the largest); with ``n_mb < n_stages`` there is one group of
    ``n_mb``. With ``n_chunks == 1`` this is :func:`eager_one_f_one_b`.

    Args:
        n_chunks: Model chunks per stage (>= 1).

    Timeline (4 stages, 4 microbatches, 2 chunks; F=1, B=1 per chunk)::

        0: F0   F1   F2   F3   F0@1 F1@1 F2@1 F3@1 .... .... .... B0@1 .... B1@1 .... B2@1 .... B3@1 B0   B1   B2   B3
        1: .... F0   F1   F2   F3   F0@1 F1@1 F2@1 F3@1 .... B0@1 .... B1@1 .... B2@1 .... B3@1 B0   B1   B2   B3   ....
        2: .... .... F0   F1   F2   F3   F0@1 F1@1 F2@1 B0@1 F3@1 B1@1 .... B2@1 .... B3@1 B0   B1   B2   B3   .... ....
        3: .... .... .... F0   F1   F2   F3   F0@1 B0@1 F1@1 B1@1 F2@1 B2@1 F3@1 B3@1 B0   B1   B2   B3   .... .... ....
    """
    check_counts(n_stages=n_stages, n_mb=n_mb, n_chunks=n_chunks)
    # Megatron's groups have n_stages microbatches; when n_mb is not a multiple,
    # the remainder is spread over the groups, so no group is smaller than n_stages
    # (a short group would need a chunk's input before the stage before could make
    # it, and deadlocks) unless there are fewer microbatches than stages.
    num_groups = max(1, n_mb // n_stages)
    sizes = [n_mb // num_groups + (g < n_mb % num_groups) for g in range(num_groups)]
    starts = [sum(sizes[:g]) for g in range(num_groups)]
    groups = [range(start, start + size) for start, size in zip(starts, sizes)]
    forwards = [Action(_F, k, c) for g in groups for c in range(n_chunks) for k in g]
    backwards = [Action(_B, k, c) for g in groups for c in reversed(range(n_chunks)) for k in g]
    total = len(forwards)
    programs = []
    for s in range(n_stages):
        warmup = min(2 * (n_stages - s - 1) + (n_chunks - 1) * sizes[0], total)
        order = forwards[:warmup]
        for i in range(total - warmup):
            order += [forwards[warmup + i], backwards[i]]
        order += backwards[total - warmup:]
        programs.append(order)
    return with_transfers(programs, n_mb, n_chunks)


def zero_bubble_h1(n_stages: int, n_mb: int) -> Schedule:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2024).

    The backward is split into I (input grad, on the critical path: its grad goes
    upstream at once) and W (weight grad, needed by no one else), and W runs late to
    fill what would be bubbles. The order is fixed by list scheduling with F = I = W
    = 1 and free transfers: at each time step a stage runs the I of its oldest
    microbatch if its grad is there; else its next forward, if its input is there and
    fewer than ``n_stages`` microbatches hold activations (forward done, W not); else
    its oldest pending W. The bound is 1F1B's peak (that of its stage 0), so peak
    memory matches 1F1B's, though later stages hold more than they do in 1F1B.
    Tuned for free transfers: with slow transfers 1F1B-like orders may do better.

    Timeline (4 stages, 8 microbatches; F=1, I=1, W=1)::

        0: F0 F1 F2 F3 .. .. .. I0 W0 I1 F4 I2 W1 I3 F5 W2 F6 I4 W3 F7 W4 I5 W5 I6 W6 .. .. I7 W7
        1: .. F0 F1 F2 F3 .. I0 W0 I1 W1 I2 F4 I3 W2 W3 F5 I4 F6 W4 .. I5 F7 I6 W5 W6 .. I7 W7 ..
        2: .. .. F0 F1 F2 I0 F3 I1 W0 I2 W1 I3 F4 W2 W3 I4 F5 W4 F6 I5 W5 I6 F7 W6 .. I7 W7 .. ..
        3: .. .. .. F0 I0 F1 I1 F2 I2 F3 I3 W0 W1 F4 I4 W2 W3 F5 I5 F6 I6 W4 W5 F7 I7 W6 W7 .. ..
    """
    check_counts(n_stages=n_stages, n_mb=n_mb)
    n, m = n_stages, n_mb
    f_end: list[list[int]] = [[] for _ in range(n)]  # end time of F k on stage s
    i_end: list[list[int]] = [[] for _ in range(n)]
    done_w = [0] * n
    programs: list[list[Action]] = [[] for _ in range(n)]
    time = 0
    while any(w < m for w in done_w):
        # Each step some stage runs something: 3 * n * m steps always suffice.
        assert time <= 3 * n * m, "zero_bubble_h1 list scheduling made no progress"
        chosen: list[tuple[int, ActionKind]] = []
        for s in range(n):
            nf, ni = len(f_end[s]), len(i_end[s])
            grad_ready = s == n - 1 or (len(i_end[s + 1]) > ni and i_end[s + 1][ni] <= time)
            input_ready = s == 0 or (len(f_end[s - 1]) > nf and f_end[s - 1][nf] <= time)
            if ni < nf and f_end[s][ni] <= time and grad_ready:
                chosen.append((s, _I))
            elif nf < m and nf - done_w[s] < n and input_ready:
                chosen.append((s, _F))
            elif done_w[s] < ni:
                chosen.append((s, _W))
        for s, kind in chosen:
            if kind is _F:
                programs[s].append(Action(_F, len(f_end[s])))
                f_end[s].append(time + 1)
            elif kind is _I:
                programs[s].append(Action(_I, len(i_end[s])))
                i_end[s].append(time + 1)
            else:
                programs[s].append(Action(_W, done_w[s]))
                done_w[s] += 1
        time += 1
    return with_transfers(programs, n_mb, 1)


SCHEDULES: Mapping[str, Callable[..., Schedule]] = MappingProxyType(
    {
        "gpipe": gpipe,
        "1f1b": one_f_one_b,
        "eager-1f1b": eager_one_f_one_b,
        "interleaved-1f1b": interleaved_one_f_one_b,
        "zb-h1": zero_bubble_h1,
        "zb-v": zero_bubble_v,
        "eager-zb-v": eager_zero_bubble_v,
        "dualpipe-v": dualpipe_v,
    }
)
"""Shipped schedule generators by name (read-only)."""

TRANSFER_AWARE = frozenset({"zb-v", "eager-zb-v"})
"""Shipped schedules built for a boundary transfer time (their ``transfer=`` option, in
units of one chunk's forward; both have two chunks per stage)."""

CHECKED = frozenset({"zb-v", "eager-zb-v"})
"""Shipped schedules whose build takes a ``check=`` callback, called now and then while
it runs (seconds for many stages and microbatches: a caller's deadline raises from it;
:data:`reshard.pipeline.v_schedules.Check`)."""


def make_schedule(name: str, n_stages: int, n_mb: int, **options: Any) -> Schedule:
    """Builds a shipped schedule by name.

    Args:
        name: A key of :data:`SCHEDULES`.
        n_stages: Number of stages.
        n_mb: Number of microbatches.
        **options: Further generator arguments (``n_chunks`` for interleaved-1f1b).

    Returns:
        The schedule.

    Raises:
        ScheduleError: The name is unknown (the message lists the valid names) or an
            argument is invalid.
    """
    generator = SCHEDULES.get(name)
    if generator is None:
        raise ScheduleError(f"unknown schedule {name!r}; valid: {', '.join(SCHEDULES)}")
    try:
        return generator(n_stages, n_mb, **options)
    except TypeError as err:
        raise ScheduleError(f"schedule {name!r}: {err}") from None


__all__ = ["CHECKED", "SCHEDULES", "TRANSFER_AWARE", "V_CANDIDATES", "dualpipe_v", "eager_one_f_one_b",
           "eager_zero_bubble_v", "gpipe", "interleaved_one_f_one_b", "make_schedule",
           "one_f_one_b", "with_transfers", "zero_bubble_h1", "zero_bubble_v"]

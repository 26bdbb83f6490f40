"""The V-shaped schedules: ZB-V, eager ZB-V and DualPipeV (two chunks per stage, the
data going down the stages on chunk 0 and back up on chunk 1; placement ``"v"``),
built by list scheduling (:func:`zero_bubble_v`) or phase by phase
(:func:`dualpipe_v`). Registered by name in :data:`reshard.pipeline.generators.SCHEDULES`.

Each takes ``n_stages`` and ``n_mb`` as every generator does
(:mod:`reshard.pipeline.generators`) and returns a schedule of 2 chunks on the V
placement.
"""

from __future__ import annotations

from collections.abc import Callable

from reshard.pipeline.actions import Action, ActionKind
from reshard.pipeline.errors import ScheduleError
from reshard.pipeline.programs import check_counts, with_transfers
from reshard.pipeline.schedule import Schedule

_F, _B, _I, _W = (
    ActionKind.FORWARD,
    ActionKind.BACKWARD,
    ActionKind.BACKWARD_INPUT,
    ActionKind.BACKWARD_WEIGHT,
)


Check = Callable[[], None]
"""Called now and then while a schedule is built (between candidates, and every
:data:`CHECK_EVERY` list-scheduling steps): a caller's deadline raises from it, so a
long build (ZB-V of 16 stages and 128 microbatches takes seconds) stops on time."""


def unchecked() -> None:
    """The :data:`Check` of a build nobody stops: does nothing."""

CHECK_EVERY = 32
"""List-scheduling time steps between two calls of a build's ``check``."""


def _v_candidates(n_stages: int, n_mb: int, transfer: float, check: Check = unchecked
                  ) -> list[Schedule]:
    """The paper's V layout, then the list-scheduled orders of :data:`V_CANDIDATES`
    that do not deadlock."""
    candidates: list[Schedule] = [_zb_v_phases(n_stages, n_mb)]
    for limit, order in V_CANDIDATES:
        check()
        try:
            candidates.append(_list_scheduled_v(n_stages, n_mb, limit + 2 * n_stages,
                                                transfer, order, check))
        except ScheduleError:  # this rule set deadlocks here
            continue
    return candidates


def zero_bubble_v(n_stages: int, n_mb: int, transfer: float = 0.0, *,
                  check: Check = unchecked) -> Schedule:
    """ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", 2024; torch's
    ``ScheduleZBVZeroBubble``).

    Two chunks per stage in a V (``placement="v"``): stage ``s`` holds virtual stages
    ``s`` and ``2 * n_stages - 1 - s``, so the data goes down the stages on chunk 0,
    turns inside the last stage and comes back up on chunk 1; the loss is on stage 0,
    and stage 0 both starts and ends every microbatch. The backward is split into I and
    W as in :func:`zero_bubble_h1`. The order is fixed by list scheduling with unit
    times per chunk (F = I = W = 1) and free transfers: at each time step a stage runs
    the ready I of its oldest microbatch (chunk 1 first: it is earlier in the
    backward); else a ready forward, chunk 1 first, a new microbatch only if the stage
    holds fewer than ``2 * n_stages`` chunk activations (forward done, W not: 1F1B's
    peak, ``n_stages`` whole-stage microbatches on stage 0); else its oldest pending W.
    A few variants of these rules (:data:`V_CANDIDATES`: forwards before Is, a limit
    one lower) and the paper's own layout (:func:`_zb_v_phases`) are simulated and the
    fastest within 1F1B's peak memory is kept (ties: the paper's). With
    ``transfer`` > 0 the list scheduling is transfer-aware: each boundary transfer
    takes that long (in units of one chunk's forward), so a stage works on what is
    ready instead of waiting on a transfer in flight (the turn of the V, inside the
    last stage, is free).

    Args:
        transfer: Boundary transfer time the order is built for (>= 0; units of one
            chunk's forward).
        check: called now and then while building (:data:`Check`: a deadline raises).

    Timeline (4 stages, 4 microbatches; F=1, I=1, W=1 per chunk)::

        0: F0   F1   F2   F3   .... .... .... F0@1 I0@1 F1@1 I1@1 F2@1 I2@1 F3@1 I3@1 I0   W0@1 I1   W0   I2   W1@1 I3   W1   W2@1 W2   W3@1 W3
        1: .... F0   F1   F2   F3   .... F0@1 .... F1@1 I0@1 F2@1 I1@1 F3@1 I2@1 I0   I3@1 I1   W0@1 I2   W0   I3   W1@1 W1   W2@1 W2   W3@1 W3
        2: .... .... F0   F1   F2   F0@1 F3   F1@1 .... F2@1 I0@1 F3@1 I1@1 I0   I2@1 I1   I3@1 I2   W0@1 I3   W0   W1@1 W1   W2@1 W2   W3@1 W3
        3: .... .... .... F0   F0@1 F1   F1@1 F2   F2@1 F3   F3@1 I0@1 I0   I1@1 I1   I2@1 I2   I3@1 I3   W0@1 W0   W1@1 W1   W2@1 W2   W3@1 W3
    """
    check_counts(n_stages=n_stages, n_mb=n_mb)
    if isinstance(transfer, bool) or not isinstance(transfer, int | float) or not \
            0 <= transfer < float("inf"):
        raise ScheduleError(f"transfer must be a number >= 0, got {transfer!r}")
    from reshard.pipeline.costs import PipelineCosts
    from reshard.pipeline.simulator import simulate

    costs = PipelineCosts(forward=1.0, backward=2.0, activation_transfer=float(transfer))
    best: tuple[float, Schedule] | None = None
    for candidate in _v_candidates(n_stages, n_mb, float(transfer), check):
        check()
        timeline = simulate(candidate, costs)
        if max(timeline.peak_activations) <= 2 * n_stages and (
                best is None or timeline.iteration_time < best[0]):
            best = (timeline.iteration_time, candidate)
    if best is None:
        raise ScheduleError(f"zb-v found no order for {n_stages} stages and {n_mb} "
                            f"microbatches within 1F1B's activation memory")
    return best[1]


def eager_zero_bubble_v(n_stages: int, n_mb: int, transfer: float = 1.0, *,
                        check: Check = unchecked) -> Schedule:
    """ZB-V with eager forwards, for exposed transfers: what eager 1F1B is to 1F1B.

    The V of :func:`zero_bubble_v`, list-scheduled for boundary transfers of
    ``transfer`` (units of one chunk's forward) with a higher memory limit: a stage may
    hold up to ``4 * n_stages - 2`` chunk activations, eager 1F1B's peak on its first
    stage (``2 * n_stages - 1`` whole-stage microbatches) where ZB-V holds 1F1B's
    ``2 * n_stages``. Stages then run forwards of later microbatches while a transfer
    is in flight instead of waiting on it. Candidates: ZB-V for this transfer time, and
    the list-scheduled V at every limit from ``2 * n_stages`` to ``4 * n_stages - 2``
    under each rule order (:data:`V_CANDIDATES`); the fastest by the simulator with
    this transfer time is kept (ties: the lower peak, then ZB-V). With free transfers
    it is ZB-V.

    Args:
        transfer: Boundary transfer time the order is built for (>= 0; units of one
            chunk's forward; 1 by default: a transfer as long as a chunk's forward).
        check: called now and then while building (:data:`Check`: a deadline raises).
    """
    base = zero_bubble_v(n_stages, n_mb, transfer, check=check)  # checks the arguments
    if not transfer:
        return base
    from reshard.pipeline.costs import PipelineCosts
    from reshard.pipeline.simulator import simulate

    costs = PipelineCosts(forward=1.0, backward=2.0, activation_transfer=float(transfer))
    cap = 4 * n_stages - 2

    def rank(schedule: Schedule) -> tuple[float, int]:
        timeline = simulate(schedule, costs)
        return timeline.iteration_time, max(timeline.peak_activations)

    best, best_rank = base, rank(base)
    for limit in range(2 * n_stages, cap + 1):
        for order in dict.fromkeys(o for _, o in V_CANDIDATES):
            try:
                candidate = _list_scheduled_v(n_stages, n_mb, limit, float(transfer), order,
                                              check)
            except ScheduleError:  # this rule set deadlocks here
                continue
            check()
            got = rank(candidate)
            if got[1] <= cap and got < best_rank:
                best, best_rank = candidate, got
    return best


def _zb_v_phases(n: int, m: int) -> Schedule:
    """ZB-V as its paper lays it out (Qi et al. 2024, section 6), stage ``s`` of ``n``:
    ``2 * (n - s) - 1`` chunk-0 forwards; ``s`` pairs of a chunk-1 and a chunk-0
    forward; ``n - s`` times chunk 1's F, I, W; then, while forwards remain, a chunk-0
    F (while any are left), I, W and a chunk-1 F, I, W; then ``s`` pairs of a chunk-0
    and a chunk-1 I; ``n - s`` times a chunk-0 I and W; the remaining Ws, chunk 1's
    first. Laid out for ``max(n_mb, 2 * n - 1)`` microbatches, the actions of the ones
    beyond ``n_mb`` dropped."""
    total = max(m, 2 * n - 1)
    programs = []
    for s in range(n):
        p = _Phases()
        for _ in range(2 * (n - s) - 1):
            p.run(_F, 0)
        for _ in range(s):
            p.run(_F, 1)
            p.run(_F, 0)
        for _ in range(n - s):
            for kind in (_F, _I, _W):
                p.run(kind, 1)
        while p.nxt[(_F, 1)] < p.nxt[(_F, 0)] or p.nxt[(_F, 0)] < total:
            if p.nxt[(_F, 0)] < total:
                p.run(_F, 0)
            for kind, c in ((_I, 0), (_W, 0), (_F, 1), (_I, 1), (_W, 1)):
                p.run(kind, c)
        for _ in range(s):
            p.run(_I, 0)
            p.run(_I, 1)
        for _ in range(n - s):
            p.run(_I, 0)
            p.run(_W, 0)
        for c in (1, 0):
            while p.nxt[(_W, c)] < p.nxt[(_I, c)]:
                p.run(_W, c)
        programs.append([a for a in p.out if a.microbatch < m])
    return with_transfers(programs, m, 2, "v")


V_CANDIDATES = ((0, "IFW"), (0, "FIW"), (-1, "IFW"), (-1, "FIW"))
""":func:`zero_bubble_v`'s list-scheduling rule sets: (memory limit beyond ``2 *
n_stages`` chunk activations, order of the rules); the fastest by the simulator within
1F1B's peak memory is kept (ties: the first)."""


def dualpipe_v(n_stages: int, n_mb: int) -> Schedule:
    """DualPipeV (DeepSeek's DualPipe, V-shaped by Sea AI's "cut-in-half"; torch's
    ``ScheduleDualPipeV``), on the V placement of :func:`zero_bubble_v`.

    Stage ``s`` of ``n`` runs eight phases: ``2 * (n - s - 1)`` forwards of chunk 0;
    ``s + 1`` pairs of chunk-0 and chunk-1 forwards; ``n - s - 1`` times chunk 1's I,
    a pending W, chunk 1's F; the main phase, ``n_mb - 2 * n + s + 1`` times a chunk-0
    forward with a chunk-1 backward and a chunk-1 forward with a chunk-0 backward
    (DualPipe overlaps each such pair on the device: one's compute hides the other's
    expert-parallel communication); ``n - s - 1`` times a chunk-1 backward then a
    chunk-1 forward with a chunk-0 backward; ``s + 1`` pairs of chunk-1 and chunk-0
    backwards (the second half split into I and W); ``n - s - 1`` times a pending W and
    a chunk-0 backward; and the last ``s + 1`` pending Ws. This IR runs one compute
    action at a time, so each overlapped pair runs as its forward, then its backward:
    what the overlap hides (communication inside a stage's compute) is not modelled.

    Args:
        n_mb: Number of microbatches (>= 2 * n_stages).
    """
    check_counts(n_stages=n_stages, n_mb=n_mb)
    if n_mb < 2 * n_stages:
        raise ScheduleError(f"dualpipe-v needs at least 2 * n_stages = {2 * n_stages} "
                            f"microbatches, got {n_mb}")
    return with_transfers([_dualpipe_v_stage(n_stages, n_mb, s) for s in range(n_stages)],
                           n_mb, 2, "v")


class _Phases:
    """One stage's compute order written phase by phase (:func:`_zb_v_phases`,
    :func:`dualpipe_v`): :meth:`run` appends the next microbatch of a kind on a chunk
    (a full backward B advances I and W alike); the Is whose W has not run yet wait,
    oldest first, for :meth:`pending_w`."""

    def __init__(self) -> None:
        self.out: list[Action] = []
        self.nxt = {(kind, c): 0 for kind in (_F, _I, _W) for c in (0, 1)}  # next microbatch
        self.weights: list[tuple[int, int]] = []  # (chunk, microbatch) of Is, W pending

    def run(self, kind: ActionKind, c: int) -> None:
        k = self.nxt[(_I if kind is _B else kind, c)]
        self.out.append(Action(kind, k, c))
        if kind is _B:
            self.nxt[(_I, c)] += 1
            self.nxt[(_W, c)] += 1
            return
        self.nxt[(kind, c)] += 1
        if kind is _I:
            self.weights.append((c, k))
        elif kind is _W:
            self.weights.remove((c, k))

    def pending_w(self) -> None:
        """The oldest pending W, if any (its own microbatch: Bs between may have
        advanced the W count past it)."""
        if self.weights:
            c, k = self.weights.pop(0)
            self.out.append(Action(_W, k, c))


def _dualpipe_v_stage(n: int, m: int, s: int) -> list[Action]:
    """Stage ``s``'s order in :func:`dualpipe_v` (its docstring's phases)."""
    p = _Phases()
    run, pending_w = p.run, p.pending_w
    for _ in range(2 * (n - s - 1)):
        run(_F, 0)
    for _ in range(s + 1):
        run(_F, 0)
        run(_F, 1)
    for _ in range(n - s - 1):
        run(_I, 1)
        pending_w()
        run(_F, 1)
    for _ in range(m - 2 * n + s + 1):
        run(_F, 0)
        run(_B, 1)
        run(_F, 1)
        run(_B, 0)
    for _ in range(n - s - 1):
        run(_B, 1)
        run(_F, 1)
        run(_B, 0)
    split = False
    for i in range(s + 1):
        split = split or (i == (s + 1) // 2 and s % 2 == 1)
        run(_I if split else _B, 1)
        split = split or (i == (s + 1) // 2 and s % 2 == 0)
        run(_I if split else _B, 0)
    for _ in range(n - s - 1):
        pending_w()
        run(_I if split else _B, 0)
    while p.weights:
        pending_w()
    return p.out


def _list_scheduled_v(n: int, m: int, limit: int, transfer: float = 0.0,
                      order: str = "IFW", check: Check = unchecked) -> Schedule:
    """The V schedule list scheduling builds (see :func:`zero_bubble_v`), holding at
    most ``limit`` chunk activations per stage; ``transfer``: each boundary transfer
    between two stages takes that long (in units of one action), so an action that
    waits on one is ready that much later (a handover inside a stage is free);
    ``check``: called every :data:`CHECK_EVERY` time steps."""
    v_count = 2 * n
    shape = Schedule.layout(n, 2, "v")
    vs = shape.virtual_stage
    stage_of = [shape.locate(v)[0] for v in range(v_count)]

    def hop(v: int, w: int) -> float:
        """Delay of data from virtual stage ``v`` to ``w`` (a transfer unless local)."""
        return 0.0 if stage_of[v] == stage_of[w] else transfer

    f_end: list[list[float]] = [[] for _ in range(v_count)]  # per virtual stage
    i_end: list[list[float]] = [[] for _ in range(v_count)]
    done_w = [0] * v_count
    free = [0.0] * n  # when each stage's compute is free
    programs: list[list[Action]] = [[] for _ in range(n)]
    time = 0.0
    steps = 0
    while any(w < m for w in done_w):
        steps += 1
        if steps % CHECK_EVERY == 0:
            check()
        if time > (6 * n * m + 4 * n) * (1 + transfer):
            raise ScheduleError(f"list scheduling a V of {n} stages and {m} microbatches "
                                f"(limit {limit}, rules {order}) deadlocked")
        for s in range(n):
            if free[s] > time:
                continue
            pick = _v_pick(s, n, m, limit, time, vs, hop, f_end, i_end, done_w, order)
            if pick is None:
                continue
            kind, c = pick
            v = vs(s, c)
            if kind is _F:
                programs[s].append(Action(_F, len(f_end[v]), c))
                f_end[v].append(time + 1)
            elif kind is _I:
                programs[s].append(Action(_I, len(i_end[v]), c))
                i_end[v].append(time + 1)
            else:
                programs[s].append(Action(_W, done_w[v], c))
                done_w[v] += 1
            free[s] = time + 1
        # next: a stage gets free, or data it waits on arrives
        later = [t for t in free if t > time]
        for v in range(v_count):
            for ends, w in ((f_end[v], v + 1), (i_end[v], v - 1)):
                if 0 <= w < v_count:
                    later += [e + hop(v, w) for e in ends if e + hop(v, w) > time]
        time = min(later, default=time + 1)
    return with_transfers(programs, m, 2, "v")


def _v_pick(s: int, n: int, m: int, limit: int, time: float, vs: Callable[[int, int], int],
            hop: Callable[[int, int], float], f_end: list[list[float]],
            i_end: list[list[float]], done_w: list[int],
            order: str = "IFW") -> tuple[ActionKind, int] | None:
    """What stage ``s`` of :func:`_list_scheduled_v` runs at ``time``: the first of
    ``order`` (``I``: a ready I, oldest microbatch, chunk 1 first; ``F``: a ready
    forward, chunk 1 first, a new microbatch only within the memory limit; ``W``: the
    oldest pending W) that it can run."""
    v_count = 2 * n

    def pick_i() -> tuple[ActionKind, int] | None:
        ready = []
        for c in (1, 0):
            v = vs(s, c)
            k = len(i_end[v])
            grad = v == v_count - 1 or (len(i_end[v + 1]) > k
                                        and i_end[v + 1][k] + hop(v + 1, v) <= time)
            if k < len(f_end[v]) and f_end[v][k] <= time and grad:
                ready.append((k, c))
        return (_I, min(ready, key=lambda kc: (kc[0], -kc[1]))[1]) if ready else None

    def pick_f() -> tuple[ActionKind, int] | None:
        # chunk activations held, counting a microbatch whose chunk-1 forward is still
        # to come as holding it already: a chunk-1 forward is then always allowed (it
        # leads to the loss; refusing it can deadlock), a chunk-0 forward (a new
        # microbatch) only within the limit
        held = sum(len(f_end[vs(s, c)]) - done_w[vs(s, c)] for c in (0, 1)) + \
            len(f_end[vs(s, 0)]) - len(f_end[vs(s, 1)])
        for c in (1, 0):
            v = vs(s, c)
            k = len(f_end[v])
            if k < m and (c == 1 or held < limit) and (v == 0 or (
                    len(f_end[v - 1]) > k and f_end[v - 1][k] + hop(v - 1, v) <= time)):
                return _F, c
        return None

    def pick_w() -> tuple[ActionKind, int] | None:
        pending = [(done_w[vs(s, c)], c) for c in (1, 0)
                   if done_w[vs(s, c)] < len(i_end[vs(s, c)])]
        return (_W, min(pending, key=lambda kc: (kc[0], -kc[1]))[1]) if pending else None

    rules = {"I": pick_i, "F": pick_f, "W": pick_w}
    for rule in order:
        got = rules[rule]()
        if got is not None:
            return got
    return None


__all__ = ["V_CANDIDATES", "dualpipe_v", "eager_zero_bubble_v", "zero_bubble_v"]

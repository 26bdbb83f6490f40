"""Planning entry points: :func:`plan` and :func:`plan_many`.

Pure and deterministic: the same inputs give the same plan, nothing touches a
process, a device or a global.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from reshard.cluster import Cluster
from reshard.dtypes import Cast, ScaleMode
from reshard.errors import ReshardError
from reshard.gcpause import paused
from reshard.layout import Layout
from reshard.planner.builds import Builds
from reshard.planner.costing.columns import estimate_columns
from reshard.planner.costing.cost import Routes, stepped_floor
from reshard.planner.cuts import cut_slices
from reshard.planner.ir import ReshardPlan
from reshard.planner.passes.allreduce import allreduce_first
from reshard.planner.passes.fine_floor import fine_floor
from reshard.planner.passes.stages import ALTERNATIVES_UP_TO, COMPARE_UP_TO, faster, search
from reshard.planner.schedule.send_columns import OrderedTasks
from reshard.planner.schedule.staging import check_budget, fit_budget, staging_sizes
from reshard.planner.values.request import Request, default_cluster, make_tensor_spec, request_parts
from reshard.planner.values.scales import with_scales
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Derive, Task, TensorSpec


def plan_many(requests: Iterable[Request], cluster: Cluster | None = None,
              strategy: str | Strategy = Strategy.BROADCAST, *, cast: object = None,
              scale: str | ScaleMode | None = None,
              memory_budget: int | None = None) -> ReshardPlan:
    """Plan several tensors together: one sender balance and one global order.

    The strategy's first plan is then searched (:mod:`reshard.planner.passes.stages`): named
    passes propose candidates (partial-sum pieces fanning out inside their last host,
    reductions fused with their deliveries, chains reshaped into trees, one task per
    device at a time) and the cost model keeps the fastest, by each pass's rule.

    A scaled cast adds its amax and scales tensors (:mod:`reshard.planner.values.scales`):
    the amaxes are reduced in a first phase, everything else moves in a second.

    Args:
        requests: ``(shape, dtype, src_layout, dst_layout)`` tuples (a fifth item: that
            tensor's cast) or TensorSpecs.
        cluster: hosts and links; default: one host holding every device.
        strategy: ``"broadcast"`` (default), ``"allgather"`` or ``"send_recv"``.
        cast: the dtype to deliver (a dtype, its name or a
            :class:`~reshard.dtypes.Cast`), for every request that names none;
            default: the source dtype.
        scale: scales of a cast to float8 (``"none"``, ``"tensor"``, ``"block128"``,
            ``"block128-ue8m0"``, ``"mx32"``: :class:`reshard.dtypes.ScaleMode`).
        memory_budget: at most this many bytes of staging (scratch) on any device: steps
            that would stage more run in buckets, boxes too big alone in pieces
            (:func:`reshard.planner.schedule.staging.fit_budget`); None: unbounded.

    Returns:
        A frozen :class:`ReshardPlan`.

    Raises:
        ReshardError: ``memory_budget`` is too small for some task (the error names the
            smallest that works).
    """
    check_budget(memory_budget)
    strat = Strategy.parse(strategy)
    tensors, cluster = planned_tensors(requests, cluster, cast, scale)
    return plan_tensors(tensors, cluster, strat, memory_budget)


def plan_tensors(tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy,
                 memory_budget: int | None) -> ReshardPlan:
    """:func:`plan_many` of its validated tensors (:func:`planned_tensors`)."""
    with paused():
        if not phased(tensors):
            return _within(_best_plan(tensors, cluster, strat), memory_budget)
        plans = [_phased(tensors, cluster, strat, early=False)]
        if any(t.derive is Derive.NONE and not t.needs_scales for t in tensors):
            plans.append(_phased(tensors, cluster, strat, early=True))
        return _within(min(plans, key=lambda p: p.estimate()), memory_budget)


def estimate_tensors(tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy
                     ) -> float:
    """``plan_tensors(tensors, cluster, strat, None).estimate()`` (:func:`plan_many`'s
    model seconds, no budget): where the first plan has more tasks than any search
    looks at (:data:`ALTERNATIVES_UP_TO`: it is the plan), priced from its columns, its
    sends never built as tasks (:func:`~reshard.planner.costing.columns.
    estimate_columns`, the same seconds)."""
    if phased(tensors):
        return plan_tensors(tensors, cluster, strat, None).estimate()
    with paused():  # the call's memo and candidates are freed before the collector
        return _estimate(tensors, cluster, strat)  # resumes: it has none to walk


def _estimate(tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy) -> float:
    """:func:`estimate_tensors` of a request planned in one phase."""
    builds = Builds()
    first = builds.columns(tensors, cluster, strat, fan_out=False)
    assert first is not None  # no limit
    if len(first[0]) > ALTERNATIVES_UP_TO:
        got = estimate_columns(first[0], tensors, cluster, builds.known)
        if got is not None:
            return got
    return _best_plan(tensors, cluster, strat, builds).estimate()


def phased(tensors: Sequence[TensorSpec]) -> bool:
    """Whether a plan of ``tensors`` runs in two phases (a scaled cast's amaxes first)."""
    return any(t.derive is Derive.AMAX for t in tensors)


def planned_tensors(requests: Iterable[Request], cluster: Cluster | None, cast: object,
                    scale: str | ScaleMode | None) -> tuple[tuple[TensorSpec, ...], Cluster]:
    """:func:`plan_many`'s tensors (the requests validated, then any a scaled cast
    adds) and its cluster (the default one when ``cluster`` is None)."""
    default = Cast.parse(cast, scale)
    reqs = [request_parts(r) for r in requests]
    if cluster is None:
        cluster = default_cluster(lay for _, _, s, d, _ in reqs for lay in (s, d))
    elif not isinstance(cluster, Cluster):
        raise ReshardError(f"cluster must be a reshard.Cluster, got {type(cluster).__name__}")
    inputs = [make_tensor_spec(*r[:4], cluster=cluster, cast=default if r[4] is None else r[4])
              for r in reqs]
    return tuple(with_scales(inputs)), cluster


def _within(plan: ReshardPlan, budget: int | None) -> ReshardPlan:
    """``plan`` with its steps fitted to ``budget`` bytes of staging per device: buckets
    filled first fit or even buckets (:func:`~reshard.planner.schedule.staging.fit_budget`),
    whichever the model says is faster (plans up to :data:`BUDGET_COMPARE_UP_TO` tasks;
    larger ones first fit). First fit is simulated only where its
    :func:`~reshard.planner.costing.cost.stepped_floor` does not already put it above the even
    buckets' prediction."""
    if budget is None:
        return plan
    sizes = staging_sizes(plan.tasks, plan.tensors)  # both bucketings read them
    first_fit = fit_budget(plan.tasks, plan.tensors, budget, even=False, sizes=sizes)
    if first_fit == plan.tasks:
        return plan
    best = ReshardPlan(plan.tensors, first_fit, plan.strategy, plan.cluster)
    if len(plan.tasks) > BUDGET_COMPARE_UP_TO:
        return best
    even = fit_budget(plan.tasks, plan.tensors, budget, even=True, sizes=sizes)
    if even != first_fit:
        balanced = ReshardPlan(plan.tensors, even, plan.strategy, plan.cluster)
        known = Routes()  # the bucketings share their tasks' routes
        balanced.routes(known)
        best.routes(known)
        # the even buckets' prediction first: where first fit's floor is above it, first
        # fit cannot be faster and is not simulated (seconds on a plan of 27k tasks)
        fast = balanced.estimate()
        if stepped_floor(best) > fast or fast < best.estimate():
            best = balanced
    return best


def _phased(tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy,
            early: bool) -> ReshardPlan:
    """The plan in two phases: the amaxes of scaled casts first, then the rest; with
    ``early``, the tensors that need no scales move in the first phase too (their
    transfers hide the amax reductions' latency; the model picks)."""
    def first_phase(t: TensorSpec) -> bool:
        return t.derive is Derive.AMAX or (early and not t.needs_scales)

    first = [i for i, t in enumerate(tensors) if first_phase(t)]
    rest = [i for i, t in enumerate(tensors) if not first_phase(t)]
    tasks = list(_phase(tensors, first, cluster, strat, 0))
    tasks += _phase(tensors, rest, cluster, strat, 1 + max((t.step for t in tasks), default=-1))
    return ReshardPlan(tensors, tuple(tasks), strat, cluster)


def _phase(tensors: tuple[TensorSpec, ...], indices: Sequence[int], cluster: Cluster,
           strat: Strategy, first_step: int) -> list[Task]:
    """The tasks of the best plan of ``tensors[indices]``, renumbered into the whole
    plan's tensors and starting at step ``first_step``."""
    best = _best_plan(tuple(tensors[i] for i in indices), cluster, strat)
    return [replace(t, tensor=indices[t.tensor], step=t.step + first_step)
            for t in best.tasks]


BASELINES_UP_TO = ALTERNATIVES_UP_TO
"""Broadcast plans up to this many tasks that the model puts above the lower bound are also planned
as the baselines (``send_recv``, ``allgather``, each searched) and, where a partial sum's meshes
coincide, all-reduce first (:mod:`reshard.planner.passes.allreduce`); the fastest by the model is
kept, so the default strategy is never modelled slower than a baseline's plan of the same
request. Larger plans (three plans cost seconds) keep their broadcasts."""


def _best_plan(tensors: tuple[TensorSpec, ...], cluster: Cluster,
               strat: Strategy, builds: Builds | None = None) -> ReshardPlan:
    """The fastest by the model of the plans tried for ``tensors``: the strategy's first
    plan, then its passes' candidates (:mod:`reshard.planner.passes.stages`); for
    ``broadcast``, also the baselines' plans and all-reduce first where they could be
    faster (:data:`BASELINES_UP_TO`), kept under the broadcast label (the request's).
    ``builds``: the planning call's memo (default: a new one)."""
    builds = Builds() if builds is None else builds
    tasks, pipelined = builds.whole(tensors, cluster, strat, fan_out=False)
    pipelined = pipelined and builds.fans_out(tensors, cluster, strat)  # else no candidate
    first_plan = builds.twins.adopt(ReshardPlan(tensors, tasks, strat, cluster)).bound_by(
        builds.bound_of(tensors, cluster))
    best = search(first_plan, pipelined, builds, known=builds.known,
                  floor_of=lambda baseline: builds.floor(tensors, cluster, baseline),
                  sends_floor=lambda: builds.send_floor(tensors, cluster), twins=builds.twins,
                  fine_floor=lambda: 0.0 if builds.over(  # 0 where finer's build is refused
                      tensors, cluster, strat, False, COMPARE_UP_TO) else fine_floor(zip(
                      builds.cut(tensors, cluster, False, False).cells,
                      [t.itemsize for t in tensors]), cluster))
    if strat is not Strategy.BROADCAST or len(best.tasks) > BASELINES_UP_TO or \
            best.estimate() <= builds.bound(tensors, cluster) * (1 + 1e-9):
        return best
    # a baseline whose floor is not below the best so far (a baseline planned before
    # it included) cannot replace it: neither built nor simulated (where its floor is
    # asked at all: :func:`floored`, and allgather's only where send_recv's ruled
    # send_recv out)
    ruled_out = True
    for baseline in (Strategy.SEND_RECV, Strategy.ALLGATHER):
        if baseline is Strategy.ALLGATHER and builds.gathers_as_sends(tensors, cluster):
            break  # its plans are send_recv's, just weighed: not kept (gather_twins)
        ruled_out = ruled_out and floored(tensors, baseline) and \
            builds.beaten(tensors, cluster, baseline, best.estimate())
        if not ruled_out:
            other = _best_plan(tensors, cluster, baseline, builds)
            if other.kept(faster, best.estimate()):
                best = builds.relabel(other, strat)
    first = allreduce_first(tensors, cluster, strat,
                            lambda ts, cl, st: _best_plan(ts, cl, st, builds))
    if first is not None:
        first = builds.twins.adopt(first.share_routes(builds.known))
        if first.kept(faster, best.estimate()):
            best = builds.relabel(first, strat)
    return best


def floored(tensors: Sequence[TensorSpec], baseline: Strategy) -> bool:
    """Whether :func:`_best_plan` asks ``baseline``'s floor (:meth:`Builds.beaten`)
    before planning it: not ``allgather``'s where a source is a partial sum, which
    costs about as much as it ever saves. On the 4x8 cold set's 231 partial-source
    requests it was found 189 times (3.9% of their CPU) and ruled the baseline out 8
    times (each a plan of about 14 ms not built): its reductions' loads and gathers
    come to 0.56-0.96 of the plan to beat. Nor is it asked where ``send_recv``'s floor
    did not rule ``send_recv`` out (:func:`_best_plan`): on the 4x8 cold set's plain
    requests and on 332 requests of other meshes and clusters, ``allgather``'s floor
    never ruled it out where ``send_recv``'s did not (210 such floors, 2-3 ms each, found
    for nothing). Either way the answer is the same (a floor rules out only a baseline
    that could not be kept); only the work differs."""
    return not (baseline is Strategy.ALLGATHER and any(t.src.spec.is_partial for t in tensors))


def plan_tasks(tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy,
               fan_out: bool, fuse: bool = False, fine: bool = False,
               limit: int | None = None) -> tuple[tuple[Task, ...], bool] | None:
    """Every task of a plan of ``tensors`` in the global order, and whether some
    broadcast of a reduced piece could fan out (:func:`ordered_tasks`, every task
    built). ``limit``: None instead where the plan would have more than ``limit``
    tasks, known before any slice is planned (:meth:`Slices.least_tasks`): a search
    pass that keeps no larger candidate builds none."""
    slices = cut_slices(tensors, cluster, strat, fuse, fine)
    if limit is not None and slices.least_tasks() > limit:
        return None
    ordered, pipelined = slices.plan(fan_out)
    return ordered.tasks(), pipelined


def ordered_tasks(tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy,
                  fan_out: bool, fuse: bool = False, fine: bool = False
                  ) -> tuple[OrderedTasks, bool]:
    """Every task of a plan of ``tensors`` in the global order (its sends still
    columns), and whether some broadcast of a reduced piece could fan out.

    Args:
        tensors: the validated tensors.
        cluster: hosts and links.
        strat: the strategy.
        fan_out: broadcasts of pipelined partial-sum pieces fan out inside their last
            host (see :meth:`reshard.planner.schedule.work.WorkList.plan`).
        fuse: partial sums reduced in one piece per root (for
            :func:`~reshard.planner.cells.fuse.fuse_reductions`, whose chains pipeline).
        fine: cells split into pieces :data:`~reshard.planner.cuts.FINE_SPLIT` times smaller.
    """
    return cut_slices(tensors, cluster, strat, fuse, fine).plan(fan_out)


BUDGET_COMPARE_UP_TO = 30_000
"""Plans up to this many tasks are costed both ways under a memory budget (buckets
filled first fit, even buckets); the model's fluid simulation of larger ones can take
minutes (a 32,435-task GB200 plan: over 90 s)."""

def plan(shape: Sequence[int], dtype: object, src: Layout, dst: Layout,
         cluster: Cluster | None = None, strategy: str | Strategy = Strategy.BROADCAST, *,
         cast: object = None, scale: str | ScaleMode | None = None,
         memory_budget: int | None = None) -> ReshardPlan:
    """Plan moving one tensor of ``shape``/``dtype`` from layout ``src`` to ``dst``.

    Args:
        shape: global tensor shape.
        dtype: numpy dtype or its name.
        src: source layout.
        dst: destination layout (may be on another mesh, disjoint or overlapping).
        cluster: hosts and links used for balancing and costing; default one host.
        strategy: ``"broadcast"`` (default), ``"allgather"`` or ``"send_recv"``.
        cast: deliver this dtype, converted at the source (default: ``dtype``).
        scale: scales of a cast to float8: ``"none"`` (saturate), ``"tensor"``,
            ``"block128"`` (128 x 128 blocks, float32), ``"block128-ue8m0"`` (the same
            blocks, powers of two as float8_e8m0fnu) or ``"mx32"`` (MXFP8: 32 elements
            of the last dim, E8M0); the plan then also delivers the scales.
        memory_budget: at most this many bytes of staging per device (see
            :func:`plan_many`).
    """
    return plan_many([(shape, dtype, src, dst)], cluster=cluster, strategy=strategy,
                     cast=cast, scale=scale, memory_budget=memory_budget)

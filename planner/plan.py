"""Planning entry points: :func:`plan` and :func:`plan_many`.

Pure and deterministic: the same inputs give the same plan, nothing touches a
process, a device or a global.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from reshard.cluster import Cluster
from reshard.dtypes import Cast, ScaleMode
from reshard.errors import ReshardError
from reshard.gcpause import paused
from reshard.layout import Layout
from reshard.planner.costing.bound import lower_bound
from reshard.planner.costing.columns import estimate_columns
from reshard.planner.costing.cost import Routes, stepped_floor
from reshard.planner.cuts import (
    Cut,
    Slices,
    cut_cells,
    cut_key,
    cut_slices,
    least_tasks,
    same_slices,
)
from reshard.planner.ir import ReshardPlan
from reshard.planner.passes.allreduce import allreduce_first
from reshard.planner.passes.fine_floor import fine_floor
from reshard.planner.passes.gather_floor import receipts_floor
from reshard.planner.passes.gather_twins import gathers_as_sends
from reshard.planner.passes.send_floor import send_floor
from reshard.planner.passes.stages import ALTERNATIVES_UP_TO, COMPARE_UP_TO, faster, search
from reshard.planner.passes.twins import Twins
from reshard.planner.schedule.floors import StepLoads, baseline_floor, reduction_loads
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


class Builds:
    """One planning call's memo: each distinct build of tasks (:func:`plan_tasks`) done
    once, and each task's route found once (:attr:`known`, shared by every candidate).

    The search asks for the same build more than once (``point-to-point`` plans the
    request as ``send_recv``, and so does the ``send_recv`` baseline's first plan), and
    keeps a baseline's tasks under the broadcast label (the model reads no strategy):
    both are answered from here. Pure: the same inputs build the same tasks, so a plan
    is the same with or without the memo."""

    def __init__(self) -> None:
        self._tasks: dict[tuple[Any, ...], tuple[tuple[Task, ...], bool]] = {}
        self._slices: dict[tuple[Any, ...], Slices] = {}  # cut, not yet planned
        self._floors: dict[tuple[Any, ...], float] = {}
        self._sends: dict[tuple[Any, ...], float] = {}  # a cut's send floor
        self._planned: dict[tuple[Any, ...], Slices] = {}  # planned, to assemble again
        self._cuts: dict[tuple[Any, ...], Cut] = {}  # every strategy's cells, cut once
        self._signatures: dict[tuple[Any, ...], tuple[object, ...]] = {}  # slices' own
        self._bounds: dict[tuple[Any, ...], float] = {}
        self._reduced: dict[tuple[Any, ...], StepLoads] = {}  # a cut's reductions' loads
        self._orders: dict[tuple[Any, ...], tuple[OrderedTasks, bool]] = {}
        self._told: dict[tuple[Any, ...], bool] = {}  # what the fine cut shows, asked once
        self.known = Routes()  # every candidate's routes (one cluster a call)
        self.twins = Twins()  # every candidate, each distinct one priced once

    def __call__(self, tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy,
                 fan_out: bool, fuse: bool = False, fine: bool = False,
                 limit: int | None = None) -> tuple[tuple[Task, ...], bool] | None:
        """:func:`plan_tasks`, each distinct question built once (a build cut short by
        ``limit`` is not remembered, its slices are)."""
        key = (tensors, cluster, strat, fan_out, fuse, fine)
        got = self._tasks.get(key)
        if got is None:
            built = self.columns(tensors, cluster, strat, fan_out, fuse, fine, limit)
            if built is None:
                return None
            got = self._tasks[key] = (built[0].tasks(), built[1])
        return got

    def columns(self, tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy,
                fan_out: bool, fuse: bool = False, fine: bool = False,
                limit: int | None = None) -> tuple[OrderedTasks, bool] | None:
        """:meth:`__call__` with the tasks in the global order, their sends still
        columns (:class:`~reshard.planner.schedule.send_columns.OrderedTasks`: built
        as tasks only where a plan asks for them)."""
        key = (tensors, cluster, strat, fan_out, fuse, fine)
        got = self._orders.get(key)
        if got is not None:
            return got
        if fine and limit is not None and not self._shown_coarse(tensors, cluster, strat, fuse) \
                and self._over(tensors, cluster, strat, fuse, limit):
            return None  # (where the cuts show the coarse slices, the coarse plan: see _over)
        if fine and self._fine_as_coarse(tensors, cluster, strat, fuse):
            coarse = self.columns(tensors, cluster, strat, fan_out, fuse, False, limit)
            if coarse is not None:
                self._orders[key] = coarse
            return coarse
        cut = (tensors, cluster, strat, fuse, fine)
        slices = self._planned.get(cut)
        if slices is not None:  # planned already, fanned out the other way: the same
            got = slices.assemble(fan_out)  # choices, only assembled
        else:
            slices = self.slices(tensors, cluster, strat, fuse, fine)
            if limit is not None and slices.least_tasks() > limit:
                return None
            del self._slices[cut]  # planning uses them up
            got = slices.plan(fan_out)
            self._planned[cut] = slices
        self._orders[key] = got
        return got

    def _over(self, tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy,
              fuse: bool, limit: int) -> bool:
        """Whether the ``fine`` cut's slices give more than ``limit`` tasks at the least
        (:func:`~reshard.planner.cuts.least_tasks`, from its cells before they are cut for
        balance): then :meth:`columns` returns None as it would after cutting them (or,
        where the cuts are alike, the coarse plan: as many tasks at the least); asked once."""
        key = ("over", tensors, cluster, strat, fuse, limit)
        if key not in self._told:  # (finer's floor asks, then its build)
            least = least_tasks(self.cut(tensors, cluster, fuse, True), cluster, strat,
                                [t.itemsize for t in tensors], fine=True)
            self._told[key] = least is not None and least > limit
        return self._told[key]

    def slices(self, tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy,
               fuse: bool = False, fine: bool = False) -> Slices:
        """:func:`cut_slices`, kept until a build plans them (their signature, for
        :meth:`_fine_as_coarse`, kept longer)."""
        key = (tensors, cluster, strat, fuse, fine)
        got = self._slices.get(key)
        if got is None:
            cut = self.cut(tensors, cluster, fuse, fine)
            got = self._slices[key] = cut_slices(tensors, cluster, strat, fuse, fine, cut)
            self._signatures[key] = (got.reduces, got.work.signature())
        return got

    def cut(self, tensors: tuple[TensorSpec, ...], cluster: Cluster, fuse: bool,
            fine: bool) -> Cut:
        """:func:`cut_cells`, once for every strategy (and for ``fuse`` and ``fine``
        where they change nothing: :func:`cut_key`)."""
        same = (tensors, cluster, *cut_key(tensors, fuse, fine))
        got = self._cuts.get(same)
        if got is None:
            # a fine cut whose reductions come out as the coarse one's has its cells
            like = self.cut(tensors, cluster, fuse, False) if same[-1] else None
            got = self._cuts[same] = cut_cells(tensors, cluster, fuse, fine, like)
        return got

    def bound(self, tensors: tuple[TensorSpec, ...], cluster: Cluster) -> float:
        """The request's lower bound (:func:`~reshard.planner.costing.bound.lower_bound`),
        found once, from the cells a plain source's slices were cut from."""
        return self.bound_of(tensors, cluster)()

    def bound_of(self, tensors: tuple[TensorSpec, ...], cluster: Cluster
                 ) -> Callable[[], float]:
        """What finds :meth:`bound` when called (holding the cells and the bounds found,
        not this memo: a plan keeps it until it is called)."""
        key, known = (tensors, cluster), self._bounds
        cut = self.cut(tensors, cluster, False, False)
        cells = [None if t.src.spec.is_partial else c for t, c in zip(tensors, cut.cells)]

        def found() -> float:
            got = known.get(key)
            if got is None:
                got = known[key] = lower_bound(tensors, cluster, cells)
            return got

        return found

    def _fine_as_coarse(self, tensors: tuple[TensorSpec, ...], cluster: Cluster,
                        strat: Strategy, fuse: bool) -> bool:
        """Whether the ``fine`` cut's slices are the coarse cut's (no cell splits
        further, no reduction changes): then every plan and floor of one is the
        other's, and the fine one is neither planned nor priced again. Where the two
        cuts show it (:func:`~reshard.planner.cuts.same_slices`), the fine slices are
        not cut; else their signatures are compared."""
        coarse, fine = ((tensors, cluster, strat, fuse, f) for f in (False, True))
        if fine not in self._signatures and self._shown_coarse(tensors, cluster, strat, fuse):
            return True  # shown from the cuts: the fine slices need not be cut
        if coarse not in self._signatures:
            self.slices(tensors, cluster, strat, fuse, False)
        if fine not in self._signatures:
            self.slices(tensors, cluster, strat, fuse, True)
        return self._signatures[coarse] == self._signatures[fine]

    def _shown_coarse(self, tensors: tuple[TensorSpec, ...], cluster: Cluster,
                      strat: Strategy, fuse: bool) -> bool:
        """Whether the cuts show the fine slices are the coarse ones (same_slices), once."""
        key = ("shown", tensors, cluster, strat, fuse)
        if key not in self._told:
            self._told[key] = same_slices(self.cut(tensors, cluster, fuse, False), self.cut(
                tensors, cluster, fuse, True), cluster, strat, [t.itemsize for t in tensors])
        return self._told[key]

    def floor(self, tensors: tuple[TensorSpec, ...], cluster: Cluster, baseline: Strategy,
              fine: bool = False) -> float:
        """The floor of every plan of ``baseline``'s slices (cut ``fine`` or not):
        :func:`~reshard.planner.schedule.floors.baseline_floor`, for ``send_recv`` the
        larger of it and the copies its hosts' NICs send out
        (:func:`~reshard.planner.passes.send_floor.send_floor`), found once."""
        key = (tensors, cluster, baseline, fine)
        got = self._floors.get(key)
        if got is None and fine and self._fine_as_coarse(tensors, cluster, baseline, False):
            got = self._floors[key] = self.floor(tensors, cluster, baseline)
        if got is None:
            s = self.slices(tensors, cluster, baseline, fine=fine)
            got = baseline_floor(s.work, s.reduces, s.itemsizes, cluster, baseline,
                                 self.known, self._reduction_loads(tensors, cluster, fine,
                                                                   s.reduces))
            if baseline is Strategy.SEND_RECV:  # and every copy its hosts send out
                got = max(got, self.send_floor(tensors, cluster, fine))
            self._floors[key] = got
        return got

    def send_floor(self, tensors: tuple[TensorSpec, ...], cluster: Cluster,
                   fine: bool = False) -> float:
        """The copies the hosts' NICs send out in every ``send_recv`` plan of a cut
        (:func:`~reshard.planner.passes.send_floor.send_floor`, the cut's cells and
        the tensors' itemsizes, as :meth:`floor` takes them), found once and without
        cutting slices. :meth:`floor` of ``send_recv`` on a cut is the larger of it and
        the slices' floor (the coarse cut's where the fine one plans as it, and then
        the coarse cut is asked too): so a check against it first (:meth:`beaten`,
        ``point-to-point``'s :attr:`~reshard.planner.passes.stages.Search.sends_floor`,
        the coarse cut's) answers as the check against :meth:`floor` where it rules
        the plans out."""
        key = (tensors, cluster, fine)
        got = self._sends.get(key)
        if got is None:
            cells = self.cut(tensors, cluster, False, fine).cells
            got = self._sends[key] = send_floor(zip(cells, [t.itemsize for t in tensors]),
                                                cluster)
        return got

    def receipts(self, tensors: tuple[TensorSpec, ...], cluster: Cluster,
                 fine: bool = False) -> float:
        """:func:`~reshard.planner.passes.gather_floor.receipts_floor` of the
        ``allgather`` slices of a cut (the slices :meth:`floor` reads, cut once)."""
        s = self.slices(tensors, cluster, Strategy.ALLGATHER, fine=fine)
        return receipts_floor(s.work, s.itemsizes, cluster)

    def _reduction_loads(self, tensors: tuple[TensorSpec, ...], cluster: Cluster,
                         fine: bool, reduces: Sequence[Task]) -> StepLoads:
        """:func:`~reshard.planner.schedule.floors.reduction_loads` of a cut's
        reductions, found once for every baseline floored on that cut (each strategy's
        slices of one cut carry the cut's reductions, :func:`cut_slices`)."""
        key = (tensors, cluster, *cut_key(tensors, False, fine))
        got = self._reduced.get(key)
        if got is None:
            got = self._reduced[key] = reduction_loads(reduces, cluster, self.known)
        return got

    def beaten(self, tensors: tuple[TensorSpec, ...], cluster: Cluster, baseline: Strategy,
               seconds: float) -> bool:
        """Whether no plan the search of ``baseline`` (``send_recv`` or ``allgather``)
        could keep is modelled faster than ``seconds``: its slices' floor
        (:meth:`floor`; the lower of the coarse and the fine cut's where a source is a
        partial sum, whose reductions ``finer`` cuts again) is not below it. For
        ``send_recv`` each cut's :meth:`send_floor` is asked first: where none is below
        ``seconds`` neither is :meth:`floor` (it is the larger of two), and no slices
        are cut for it. For ``allgather`` its slices' receipts are asked first
        (:func:`~reshard.planner.passes.gather_floor.receipts_floor`, no higher than
        :meth:`floor`, and quicker)."""
        cuts = (False, True) if any(t.src.spec.is_partial for t in tensors) else (False,)
        quick = {Strategy.SEND_RECV: self.send_floor,
                 Strategy.ALLGATHER: self.receipts}.get(baseline)
        if quick is not None and all(quick(tensors, cluster, fine) >= seconds for fine in cuts):
            return True  # each cut's floor is at least its quicker one (send_recv's: no
            # slices cut)
        return all(self.floor(tensors, cluster, baseline, fine) >= seconds for fine in cuts)

    def gathers_as_sends(self, tensors: tuple[TensorSpec, ...], cluster: Cluster) -> bool:
        """Whether the ``allgather`` baseline's plans are the ``send_recv`` baseline's,
        task for task, shown from the cells of the cuts its search builds from (the
        coarse one, and the fine one where a source is a partial sum:
        :func:`~reshard.planner.passes.gather_twins.gathers_as_sends`)."""
        coarse = self.cut(tensors, cluster, False, False)
        cells = list(coarse.cells)
        if any(t.src.spec.is_partial for t in tensors):
            cells += self.cut(tensors, cluster, False, True).cells
        return gathers_as_sends(cells, coarse.loads.host)

    def fans_out(self, tensors: tuple[TensorSpec, ...], cluster: Cluster,
                 strat: Strategy) -> bool:
        """Whether ``strat``'s first plan (built: :meth:`whole`, not fanned out) fanned
        out would split some chain (:meth:`~reshard.planner.cuts.Slices.splits_chains`);
        where not, that plan is the first plan, task for task, and the ``fan-out`` pass,
        keeping only a faster plan, has nothing to keep."""
        slices = self._planned.get((tensors, cluster, strat, False, False))
        return slices is None or slices.splits_chains()

    def whole(self, tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy,
              fan_out: bool) -> tuple[tuple[Task, ...], bool]:
        """:meth:`__call__` without a limit (never None)."""
        got = self(tensors, cluster, strat, fan_out)
        assert got is not None
        return got

    def relabel(self, plan: ReshardPlan, strat: Strategy) -> ReshardPlan:
        """``plan``'s tasks as a plan of ``strat``, its model time and routes kept (the
        cost model reads the tasks, the tensors and the cluster, never the label)."""
        out = ReshardPlan(plan.tensors, plan.tasks, strat, plan.cluster)
        for key in _PRICED:
            if key in plan._cache:
                out._cache[key] = plan._cache[key]
        return out


_PRICED = ("estimate", "routes", "latencies", "lower_bound", "one at a time")
"""What a plan caches that depends on its tasks, tensors and cluster alone (not on its
strategy label): :meth:`Builds.relabel` keeps them."""


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
                  fine_floor=lambda: 0.0 if builds._over(  # 0 where finer's build is refused
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

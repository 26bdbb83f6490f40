"""One planning call's memo (:class:`Builds`): every build, cut, floor and bound a call of
:func:`~reshard.planner.plan.plan_many` asks for, found once and shared by every candidate
its search weighs. Pure: a plan is the same with or without it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from reshard.cluster import Cluster
from reshard.planner.costing.bound import lower_bound
from reshard.planner.costing.cost import Routes
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
from reshard.planner.passes.gather_floor import receipts_floor
from reshard.planner.passes.gather_twins import gathers_as_sends
from reshard.planner.passes.send_floor import send_floor
from reshard.planner.passes.twins import Twins
from reshard.planner.schedule.floors import StepLoads, baseline_floor, reduction_loads
from reshard.planner.schedule.send_columns import OrderedTasks
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task, TensorSpec


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
                and self.over(tensors, cluster, strat, fuse, limit):
            return None  # (where the cuts show the coarse slices, the coarse plan: see over)
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

    def over(self, tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy,
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

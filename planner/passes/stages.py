"""A strategy's search: its first plan, then named passes, each proposing candidate
plans that the one cost model accepts or rejects.

The first plan of a strategy is what :func:`~reshard.planner.plan.plan_tasks` builds
(chains for ``broadcast``, point-to-point sends for ``send_recv``, scatters and
all-gathers for ``allgather``; the global order, the NIC balance). The passes then run
in stages (:data:`STAGES`): every pass of a stage proposes candidates from the best
plan when the stage began, and a candidate replaces the running best when its pass's
rule (:attr:`Pass.keep`, on the model's times) says so. Each pass is a name, the file
that builds its candidates, a size limit and a rule:

========================  =====================  ========================================
pass                      builds with            kept when (model times)
========================  =====================  ========================================
``fan-out``               ``cell_tasks.fan_out``  faster
``finer``                 ``plan.py`` (``fine``)  faster by :data:`SPLIT_GAIN`
``fused``                 ``fuse.py``             faster
``fused:<shape>``         ``fuse.py``             faster by :data:`SUM_GAIN`
``trees:<hosts>/<intra>`` ``trees.py``            faster by :data:`TREE_GAIN`
``point-to-point``        ``cell_tasks.py``       at most :data:`RELAY_GAIN` slower
``least-concurrent``      ``order.py``            at most :data:`CONCURRENCY_GAIN` slower
========================  =====================  ========================================

(``<shape>``: ``star`` or ``binary``, the sum's tree; ``fused`` sums down chains.)
(Coalescing is not a candidate: it changes no task, only how a step's small transfers
travel, and every device derives it from the plan alone, :mod:`reshard.planner.schedule.coalesce`.)
A pass is skipped when a floor of its candidates' times (the request's lower bound,
or one of its own: ``least-concurrent``'s is each device's tasks back to back,
``point-to-point``'s its ``send_recv`` slices' floor, :attr:`Search.floor_of`) could
not be kept: a plan at the bound is searched no further by the passes that keep only
faster plans. ``least-concurrent`` first tries quicker proofs (nothing to reorder, or
one device's tasks back to back already not kept: :mod:`reshard.planner.passes.serial_floor`);
``point-to-point`` first the copies its hosts send out, found from the cut before any
slice is cut (:attr:`Search.sends_floor`).
Pure: passes build plans, the search compares their model times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from reshard.cluster import Cluster
from reshard.planner.cells.fuse import SumShape, fuse_reductions
from reshard.planner.cells.trees import TREE_FORMS, HostShape, Intra, Segments, reshapes, treeify
from reshard.planner.costing.cost import Routes
from reshard.planner.ir import ReshardPlan
from reshard.planner.passes.serial_floor import serial_ruled_out
from reshard.planner.passes.tree_floor import Chains, FormSums, floor_of, reshaped_chains
from reshard.planner.passes.tree_twins import same_as_star
from reshard.planner.passes.twins import Twins
from reshard.planner.schedule.order import one_at_a_time
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task, TaskKind, TensorSpec

T = TypeVar("T")

COMPARE_UP_TO = 1024
"""Plans up to this many tasks are also costed one task per device at a time, and
broadcasts of pipelined partial sums also with their chains fanning out (the cheaper
by the model is kept)."""

TREES_UP_TO = 2048
"""Broadcast plans up to this many tasks are also costed with their chains reshaped
into trees (:data:`~reshard.planner.cells.trees.TREE_FORMS`; each form about 0.1 ms of
simulation per task)."""

FUSE_UP_TO = 2048
"""Broadcast plans of partial sums up to this many tasks are also costed with each
root's reductions fused into its deliveries (:func:`~reshard.planner.cells.fuse.
fuse_reductions`; a 16384 x 16384 float32 S0R+P1 (4, 8) -> RS0 (4, 8) on dgx-h100 has
1,280 tasks: 1.27x the bound unfused, 1.035x fused)."""

ALTERNATIVES_UP_TO = max(COMPARE_UP_TO, TREES_UP_TO, FUSE_UP_TO)
"""Plans of more tasks than this are kept as first planned: no pass proposes anything
against them, so a device's share of such a plan can be cut before the plan's other
tasks are built (:mod:`reshard.planner.share`)."""

TREE_GAIN = 0.001
"""A tree form is kept only when the model predicts at least this much gain over the
best plan so far: trees cost real backends more than the model says (more messages,
relays passing on to several devices). On the emulated testbed a double tree the
model rated 0.004% faster than its chain measured 5% slower (1-to-4x2: 1.15 vs 1.10
of the bound); the realistic suite's trees gain 0.15-67%."""

SUM_GAIN = 0.005
"""A fused sum whose addends pass their running sums up a star or a binary tree (not a
chain) is kept only when the model predicts at least this much gain: a star's root
receives every addend's box at once, which costs a real backend more than the model
says where the model thinks another link the bottleneck. Four addends of a 16 MiB
float32 tensor on 8 gloo workers over loopback, summed into one root (one NIC per host,
aws-p3.8xlarge figures: the NIC bounds the model): stars measured 73 ms, chains 53 ms,
where the model rated the star 0.07% faster; with the roots rotating (four NICs per
host) 51.6 vs 52.7 ms. On a DGX H100 partial sum the star gains 2.6% (1 GiB) to 62% (4
MiB)."""

SPLIT_GAIN = 0.02
"""Cells split finer (:data:`~reshard.planner.cuts.FINE_SPLIT`) are kept only when the
model predicts at least this much gain: more tasks cost a real backend more than the
model says (each is an operation and a message). On dgx-h100 a 4 MB RR (2, 8) -> RS0
(4, 8) over the same hosts gains 2.4x (each receiver's own 1 MB over its own NIC,
against 128 KB pieces over all eight and a hop inside the host)."""

CONCURRENCY_GAIN = 0.02
"""Concurrent steps are kept only when the model predicts at least this much gain."""

RELAY_GAIN = 0.005
"""Relays (chains, trees) are kept over point-to-point sends only when the model
predicts at least this much gain: a relay costs a real backend more than the model says
(it holds a piece before passing it on, and its process works for others). On the
emulated testbed the weight-sync slice's chains measured 1.056x the bound, the same
request as point-to-point sends 1.022x, where the model rated them within 0.1%."""

class BuildTasks(Protocol):
    """What builds a plan's tasks (:func:`reshard.planner.plan.plan_tasks`, given to
    the search: the planner's entry module imports this one, not the other way)."""

    def __call__(self, tensors: tuple[TensorSpec, ...], cluster: Cluster, strat: Strategy,
                 fan_out: bool, fuse: bool = False, fine: bool = False,
                 limit: int | None = None) -> tuple[tuple[Task, ...], bool] | None:
        """Every task in the global order, and whether some broadcast of a reduced
        piece could fan out; None where the plan would have more than ``limit``
        tasks (known before it is built)."""
        ...


@dataclass(frozen=True)
class Search:
    """What every pass may read: the request, and the strategy's first plan.

    Attributes:
        tensors: the validated tensors.
        cluster: hosts and links.
        strategy: the strategy.
        first: the strategy's first plan.
        pipelined: some broadcast of a reduced piece could fan out (from building the
            first plan).
        build: builds a plan's tasks (``build(tensors, cluster, strategy, fan_out=...,
            fuse=..., fine=...)``), :func:`~reshard.planner.plan.plan_tasks`.
        built: tasks a pass built that another may reuse (by name; this search's own).
        floor_of: seconds no plan of a baseline strategy's first cut of the request
            takes less than in the model (:meth:`reshard.planner.builds.Builds.floor`),
            where the caller knows them; ``point-to-point``'s floor.
        segments: the host segments of the chains of each plan the tree forms start
            from (by the plan's id, with the plan), cut once for every form.
        known: the routes of tasks already costed on the cluster, by what decides them
            (:func:`~reshard.planner.costing.cost.task_routes`), shared by the planning
            call's candidates.
        twins: the planning call's candidates so far: one with the tasks of an
            earlier one takes its prediction (:mod:`reshard.planner.passes.twins`).
        trees: the tasks of each start plan's tree form passing on as a star (by the
            plan's id, kept alive by :attr:`segments`, and the host shape).
        sends_floor: seconds no ``send_recv`` plan of the first cut takes less than,
            never above ``floor_of(Strategy.SEND_RECV)`` and found without cutting its
            slices (:meth:`reshard.planner.builds.Builds.send_floor`), where the caller
            knows it: ``point-to-point``'s quicker proof.
        fine_floor: seconds no ``broadcast`` plan of the request's plain sources takes
            less than, found from its cells (:func:`~reshard.planner.passes.fine_floor.
            fine_floor`), where the caller knows it: ``finer``'s floor.
        tree_sums: the tree floors' sums of each chain form, per tree form
            (:data:`~reshard.planner.passes.tree_floor.FormSums`).
        tree_chains: each starting plan's chains a host shape reshapes, per shape
            (:func:`~reshard.planner.passes.tree_floor.reshaped_chains`).
        star_twins: per starting plan and host shape, the star form's tasks where they
            are also the form's passing on as a chain (:func:`_star_twin`).
    """

    tensors: tuple[TensorSpec, ...]
    cluster: Cluster
    strategy: Strategy
    first: ReshardPlan
    pipelined: bool
    build: BuildTasks
    built: dict[str, tuple[Task, ...]] = field(default_factory=dict, compare=False)
    known: Routes = field(default_factory=Routes, compare=False)
    segments: dict[int, tuple[ReshardPlan, Segments]] = field(default_factory=dict,
                                                              compare=False)
    floor_of: Callable[[Strategy], float] | None = field(default=None, compare=False)
    twins: Twins = field(default_factory=Twins, compare=False)
    trees: dict[tuple[int, HostShape], tuple[Task, ...]] = field(default_factory=dict,
                                                                  compare=False)
    sends_floor: Callable[[], float] | None = field(default=None, compare=False)
    fine_floor: Callable[[], float] | None = field(default=None, compare=False)
    tree_sums: FormSums = field(default_factory=dict, compare=False)
    tree_chains: dict[tuple[int, HostShape], tuple[ReshardPlan, Chains | None]] = field(
        default_factory=dict, compare=False)
    star_twins: dict[tuple[int, HostShape], tuple[ReshardPlan, tuple[Task, ...] | None]] = \
        field(default_factory=dict, compare=False)

    def plan(self, tasks: Sequence[Task]) -> ReshardPlan:
        """A candidate plan of these tasks (its routes found in :attr:`known`, the
        memo of the tasks' routes every candidate of the planning call shares; priced
        as an earlier candidate of the same tasks, :attr:`twins`)."""
        return self.twins.adopt(ReshardPlan(self.tensors, tuple(tasks), self.strategy,
                                            self.cluster).share_routes(self.known))


def faster(candidate: float, best: float) -> bool:
    """Kept when the model says the candidate is faster."""
    return candidate < best


def faster_by_tree_gain(candidate: float, best: float) -> bool:
    """Kept when faster by at least :data:`TREE_GAIN`."""
    return candidate * (1 + TREE_GAIN) < best


def faster_by_sum_gain(candidate: float, best: float) -> bool:
    """Kept when faster by at least :data:`SUM_GAIN`."""
    return candidate * (1 + SUM_GAIN) < best


def faster_by_split_gain(candidate: float, best: float) -> bool:
    """Kept when faster by at least :data:`SPLIT_GAIN`."""
    return candidate * (1 + SPLIT_GAIN) < best


def within_relay_gain(candidate: float, best: float) -> bool:
    """Kept unless the best is faster by :data:`RELAY_GAIN` or more."""
    return candidate <= best * (1 + RELAY_GAIN)


def within_concurrency_gain(candidate: float, best: float) -> bool:
    """Kept unless the best is faster by :data:`CONCURRENCY_GAIN` or more."""
    return candidate <= best * (1 + CONCURRENCY_GAIN)


@dataclass(frozen=True)
class Pass:
    """One candidate of a strategy's search.

    Attributes:
        name: its name (``"fan-out"``, ``"trees:double/star"``, ...).
        up_to: it proposes nothing against a stage's starting plan of more tasks.
        propose: its candidates, from the search and the stage's starting plan.
        keep: whether a candidate (its model time) replaces the best (its model time).
        floor: a time none of its candidates can beat (model seconds), cheaper than
            building them; without one, the request's lower bound. A pass whose floor
            its rule would not keep proposes nothing (every rule keeps a faster
            candidate when it keeps a slower one).
        ruled_out: a quicker proof, asked before :attr:`floor`, that the pass keeps
            nothing from the start (given whether its rule, against the best so far,
            would keep a plan of so many seconds, the bound included): True only
            where it has no candidate or a floor no higher than :attr:`floor` is not
            kept (then :attr:`floor` would not be either); False leaves it to
            :attr:`floor`.
    """

    name: str
    up_to: int
    propose: Callable[[Search, ReshardPlan], Iterator[ReshardPlan]]
    keep: Callable[[float, float], bool] = faster
    floor: Callable[[Search, ReshardPlan], float] | None = None
    ruled_out: Callable[[Search, ReshardPlan, Callable[[float], bool]], bool] | None = None


def _fanned(search: Search, start: ReshardPlan) -> Iterator[ReshardPlan]:
    """Broadcasts of pipelined partial-sum pieces fanning out inside their last host."""
    if not search.pipelined:
        return
    got = search.build(search.tensors, search.cluster, search.strategy, fan_out=True,
                       limit=COMPARE_UP_TO)
    if got is not None and len(got[0]) <= COMPARE_UP_TO:
        yield search.plan(got[0])


def _finer(search: Search, start: ReshardPlan) -> Iterator[ReshardPlan]:
    """The request planned again with its cells split finer."""
    got = search.build(search.tensors, search.cluster, search.strategy, fan_out=False,
                       fine=True, limit=COMPARE_UP_TO)
    if got is not None and len(got[0]) <= COMPARE_UP_TO and got[0] != search.first.tasks:
        yield search.plan(got[0])


def _finer_floor(search: Search, start: ReshardPlan) -> float:
    """No fine plan of a ``broadcast`` request of plain sources beats the least latency of
    a chain into a host plus the bytes it takes in over its NICs (:attr:`Search.
    fine_floor`, where the search knows it; else 0, and the bound decides)."""
    if search.fine_floor is None or search.strategy is not Strategy.BROADCAST or any(
            t.src.spec.is_partial for t in search.tensors):
        return 0.0
    return search.fine_floor()


def _fused(shape: SumShape) -> Callable[[Search, ReshardPlan], Iterator[ReshardPlan]]:
    """Each root's reductions fused into its deliveries (broadcast only), the addends'
    running sums passed on in ``shape``."""
    def propose(search: Search, start: ReshardPlan) -> Iterator[ReshardPlan]:
        if search.strategy is not Strategy.BROADCAST or not fuses_some(search):
            return
        tensors = search.tensors
        tasks = search.built.get("fuse")  # one build serves every shape
        if tasks is None:
            got = search.build(tensors, search.cluster, search.strategy, fan_out=False,
                               fuse=True)
            assert got is not None  # no limit
            tasks = search.built["fuse"] = got[0]
        fusable = {i for i, t in enumerate(tensors) if t.fuses}
        yield search.plan(fuse_reductions(tasks, fusable, shape))

    return propose


def fuses_some(search: Search) -> bool:
    """Whether the first plan has a reduction of a tensor that fuses
    (:attr:`~reshard.planner.values.tasks.TensorSpec.fuses`): the tensors that fuse
    found first, so that a request with none (a bf16 sum accumulates in float32) reads
    no task, and one with some reads each task's kind and tensor, not the property."""
    fusing = {i for i, t in enumerate(search.tensors) if t.fuses}
    return bool(fusing) and any(t.kind is TaskKind.REDUCE and t.tensor in fusing
                                for t in search.first.tasks)


def _point_to_point(search: Search, start: ReshardPlan) -> Iterator[ReshardPlan]:
    """A broadcast plan with relays (chains, trees) planned again as point-to-point sends
    (each receiver its own copy from a holder), for :func:`within_relay_gain`."""
    if not _relays(search, start):  # no relays to replace
        return
    got = search.build(search.tensors, search.cluster, Strategy.SEND_RECV, fan_out=False,
                       limit=COMPARE_UP_TO)
    if got is not None and len(got[0]) <= COMPARE_UP_TO:
        yield search.plan(got[0])


def _point_to_point_floor(search: Search, start: ReshardPlan) -> float:
    """No point-to-point plan of the request beats its ``send_recv`` slices' floor
    (where the search knows it; else 0, and the bound decides)."""
    if search.floor_of is None or not _relays(search, start):  # no candidate: nothing
        return 0.0  # to cut
    return search.floor_of(Strategy.SEND_RECV)


def _point_to_point_ruled_out(search: Search, start: ReshardPlan,
                              keeps: Callable[[float], bool]) -> bool:
    """No relays to replace (no candidate: its send floor is not found), or the copies
    the hosts send out in every point-to-point plan already not kept
    (:attr:`Search.sends_floor`, no higher than :func:`_point_to_point_floor`, which
    is then neither found nor needed: its slices are not cut)."""
    return not _relays(search, start) or (search.sends_floor is not None
                                          and not keeps(search.sends_floor()))


def _relays(search: Search, start: ReshardPlan) -> bool:
    """Whether ``point-to-point`` has a candidate: a broadcast plan with a relay (a
    task of two or more receivers, which its sends would replace)."""
    return search.strategy is Strategy.BROADCAST and any(
        len(t.receivers) >= 2 for t in start.tasks)


def _trees(shape: HostShape, intra: Intra) -> Callable[[Search, ReshardPlan],
                                                       Iterator[ReshardPlan]]:
    """The starting plan's chains reshaped into trees of this form (where the form
    passing on as a star was built from the same plan and no chain it reshapes
    passes anything on inside a host, its tasks: :func:`~reshard.planner.passes.
    tree_twins.same_as_star`)."""
    def propose(search: Search, start: ReshardPlan) -> Iterator[ReshardPlan]:
        host = search.cluster.host_of
        memo = _segments(search, start)
        star = None if intra is Intra.STAR else _star_twin(search, start, shape)
        if star is not None:
            yield search.plan(star)
        elif reshapes(start.tasks, host, shape, memo):
            tasks = treeify(start.tasks, host, intra, shape, memo)
            if intra is Intra.STAR:
                search.trees[(id(start), shape)] = tasks  # start is kept by the memo
            yield search.plan(tasks)

    return propose


def _segments(search: Search, start: ReshardPlan) -> Segments:
    """The host segments of ``start``'s chains, cut once per starting plan
    (:attr:`Search.segments`, shared by every tree form, its floor and its twin check)."""
    return search.segments.setdefault(id(start), (start, {}))[1]


def _per_start(memo: dict[tuple[int, HostShape], tuple[ReshardPlan, T]], start: ReshardPlan,
               shape: HostShape, make: Callable[[], T]) -> T:
    """``make()``, found once per starting plan and host shape in ``memo`` (keyed by the
    plan's id and checked by identity: the memo keeps the plan alive)."""
    got = memo.get((id(start), shape))
    if got is None or got[0] is not start:
        got = memo[(id(start), shape)] = (start, make())
    return got[1]


def _star_twin(search: Search, start: ReshardPlan, shape: HostShape
               ) -> tuple[Task, ...] | None:
    """The star form's tasks of ``shape``, where they were built from ``start`` and are
    also the form's passing on as a chain (:func:`~reshard.planner.passes.tree_twins.
    same_as_star`; asked once per start and shape); else None."""
    def twin() -> tuple[Task, ...] | None:
        star = search.trees.get((id(start), shape))
        same = star is not None and same_as_star(start.tasks, search.cluster.host_of,
                                                 shape, _segments(search, start))
        return star if same else None

    return _per_start(search.star_twins, start, shape, twin)


def _trees_floor(shape: HostShape, intra: Intra) -> Callable[[Search, ReshardPlan], float]:
    """No plan of the starting plan's chains reshaped into this form beats its trees'
    least latency plus its busiest NIC's bytes, or its first tree's latency, where every
    task is a chain the form reshapes (:func:`~reshard.planner.passes.tree_floor.
    floor_of`; the chains found once per host shape); else 0, and the bound decides
    (also where the form's candidate is the star form's plan, priced already:
    :func:`_star_twin`)."""
    def floor(search: Search, start: ReshardPlan) -> float:
        if intra is not Intra.STAR and _star_twin(search, start, shape) is not None:
            return 0.0  # its candidate is the star form's plan, priced already
        chains = _per_start(search.tree_chains, start, shape, lambda: reshaped_chains(
            start.tasks, search.cluster, shape, _segments(search, start)))
        return 0.0 if chains is None else floor_of(chains, search.cluster, shape, intra,
                                                   search.tree_sums)

    return floor


TREE_FLOORS = frozenset(TREE_FORMS[1:])
"""The tree forms given a floor (:func:`_trees_floor`): not the first, ``double/star``,
which is built from the stage's starting plan before any other and was kept every time
it was built over the 4x8 cold set (a floor there never ruled it out)."""


def _serial_floor(search: Search, start: ReshardPlan) -> float:
    """No plan running each device's tasks one at a time beats each device's tasks
    back to back (:func:`~reshard.planner.costing.cost.one_at_a_time_time`; found once
    for a plan and its twins, :meth:`~reshard.planner.ir.ReshardPlan.one_at_a_time_time`)."""
    return start.one_at_a_time_time()


def _serial_ruled_out(search: Search, start: ReshardPlan,
                      keeps: Callable[[float], bool]) -> bool:
    """Nothing to reorder, or one device's tasks back to back already not kept
    (:func:`~reshard.planner.passes.serial_floor.serial_ruled_out`)."""
    return serial_ruled_out(start, keeps)


def _serial(search: Search, start: ReshardPlan) -> Iterator[ReshardPlan]:
    """The starting plan's tasks one per device and step (operations in flight at once
    cost real backends more than the model says; :mod:`reshard.planner.schedule.order`)."""
    serial = one_at_a_time(start.tasks)
    if serial != start.tasks:
        yield search.plan(serial)


STAGES: tuple[tuple[Pass, ...], ...] = (
    (Pass("fan-out", COMPARE_UP_TO, _fanned),
     Pass("finer", COMPARE_UP_TO, _finer, faster_by_split_gain, _finer_floor),
     Pass("fused", FUSE_UP_TO, _fused(SumShape.CHAIN)),
     *(Pass(f"fused:{shape.value}", FUSE_UP_TO, _fused(shape), faster_by_sum_gain)
       for shape in (SumShape.STAR, SumShape.BINARY))),
    tuple(Pass(f"trees:{shape.value}/{intra.value}", TREES_UP_TO, _trees(shape, intra),
               faster_by_tree_gain,
               _trees_floor(shape, intra) if (shape, intra) in TREE_FLOORS else None)
          for shape, intra in TREE_FORMS),
    (Pass("point-to-point", COMPARE_UP_TO, _point_to_point, within_relay_gain,
          _point_to_point_floor, _point_to_point_ruled_out),),
    (Pass("least-concurrent", COMPARE_UP_TO, _serial, within_concurrency_gain,
          _serial_floor, _serial_ruled_out),),
)
"""Every pass, in stages (see the module docstring)."""


def search(first: ReshardPlan, pipelined: bool, build: BuildTasks,
           stages: Sequence[Sequence[Pass]] = STAGES, known: Routes | None = None,
           floor_of: Callable[[Strategy], float] | None = None,
           twins: Twins | None = None,
           sends_floor: Callable[[], float] | None = None,
           fine_floor: Callable[[], float] | None = None) -> ReshardPlan:
    """The best plan of ``first``'s request: ``first``, or a candidate of a pass that its
    rule kept (see the module docstring). ``known``: routes already found on the
    cluster (:attr:`Search.known`; default: ``first``'s candidates share a new memo).
    ``floor_of``: :attr:`Search.floor_of`. ``twins``: :attr:`Search.twins` (default:
    a new memo). ``sends_floor``, ``fine_floor``: :attr:`Search.sends_floor`,
    :attr:`Search.fine_floor`."""
    s = Search(first.tensors, first.cluster, first.strategy, first, pipelined, build,
               known=Routes() if known is None else known, floor_of=floor_of,
               twins=Twins() if twins is None else twins, sends_floor=sends_floor,
               fine_floor=fine_floor)
    first.share_routes(s.known)
    best = first
    for stage in stages:
        start = best
        for p in stage:
            if len(start.tasks) > p.up_to:
                continue
            bound = first.lower_bound()  # computed once, where some pass applies
            if not p.keep(bound, best.estimate()) or _ruled_out(p, s, start, bound, best) or (
                    p.floor is not None and not p.keep(max(bound, p.floor(s, start)),
                                                       best.estimate())):
                continue  # no candidate of it could be kept (its own floor, if any,
                # is computed only where the bound and its quicker proof do not
                # already say so)
            for candidate in p.propose(s, start):
                if candidate.kept(p.keep, best.estimate()):  # simulated as far as needed
                    best = candidate
    return best


def _ruled_out(p: Pass, s: Search, start: ReshardPlan, bound: float,
               best: ReshardPlan) -> bool:
    """:attr:`Pass.ruled_out` of ``p``, where it has one, against ``best`` (the
    request's ``bound`` included, as for its floor)."""
    if p.ruled_out is None:
        return False
    beat = best.estimate()
    return p.ruled_out(s, start, lambda seconds: p.keep(max(bound, seconds), beat))


def pass_names(stages: Sequence[Sequence[Pass]] = STAGES) -> tuple[str, ...]:
    """Every pass's name, in the order the search runs them."""
    return tuple(p.name for stage in stages for p in stage)


__all__ = ["ALTERNATIVES_UP_TO", "COMPARE_UP_TO", "CONCURRENCY_GAIN", "FUSE_UP_TO",
           "SPLIT_GAIN", "STAGES", "SUM_GAIN", "TREES_UP_TO", "TREE_GAIN", "Pass", "Search",
           "pass_names", "search"]

"""A choice's iteration time from the pipeline simulator, and the DP's best few
re-ranked by it.

The objective (:mod:`reshard.search.chain`) is a closed form: it puts a stage's moves
on its period (1F1B) or lets them hide behind its compute (eager 1F1B). The simulator
(:func:`reshard.pipeline.simulate`) runs the schedule's actions: a stage's forward
(a third of its time per microbatch: compute and inner moves) and backward (two
thirds) on its compute stream, every activation and gradient on its own link beside
it, a receive waiting only for its own data. It differs from the objective where the
closed form is coarse: under 1F1B a move overlaps the sender's next action (the
objective charges it in full), fill and drain see each boundary's moves once per
direction (the objective sums them once), and a stage whose move in is its bottleneck
waits only as long as its receives do. Skip connections' moves are charged to the
boundary before the stage they enter (the simulator has links between neighbours only).
A virtual-stage choice (interleaved 1F1B, ZB-V, DualPipeV) runs its pieces as the
schedule's virtual stages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from reshard.cluster import Cluster
from reshard.errors import ReshardError, SearchError
from reshard.pipeline.costs import PipelineCosts
from reshard.pipeline.schedule import Schedule
from reshard.pipeline.simulator import simulate
from reshard.search.costs import MoveCosts
from reshard.search.kinds import SearchSchedule
from reshard.search.memory import Orders
from reshard.search.model import Budget, Choice, Layer
from reshard.search.objective import chain_edges, named_candidates, stage_index

FORWARD_SHARE = 1 / 3
"""A stage's forward share of its time per microbatch (the backward takes the rest)."""


def simulated(layers: Sequence[Layer], choice: Choice, cluster: Cluster,
              costs: MoveCosts | None = None,
              edges: Sequence[tuple[int, int]] | None = None,
              schedule: str | None = None, orders: Orders | None = None) -> float:
    """``choice``'s iteration time under the simulator running its schedule, or
    ``schedule`` (any of :data:`reshard.pipeline.SCHEDULES` that runs the choice's
    pieces per submesh on the same placement: for a choice of one piece per submesh
    ``gpipe``, ``1f1b``, ``eager-1f1b``, ``zb-h1``; for two on a V ``zb-v``,
    ``eager-zb-v``, ``dualpipe-v``) (module docstring); ``edges`` as
    :func:`reshard.search.evaluate` takes them; ``orders``: the search's pipeline
    schedules, kept. A move between two pieces of one submesh (a local handover in the
    simulator) is charged to the receiving piece's compute.

    Raises:
        SearchError: a schedule that places pieces otherwise, or an unknown one.
    """
    costs = MoveCosts(cluster) if costs is None else MoveCosts(cluster, False, costs.cache)
    order = _order(choice, choice.schedule if schedule is None else schedule,
                   Orders() if orders is None else orders)
    stages = choice.stages
    stage_of = stage_index(stages)
    cands = named_candidates(layers, stages)
    fwd = [(st.compute + st.inner) * FORWARD_SHARE for st in stages]
    bwd = [(st.compute + st.inner) * (1 - FORWARD_SHARE) for st in stages]
    there = [0.0] * max(0, len(stages) - 1)
    back = [0.0] * max(0, len(stages) - 1)
    for u, v in (chain_edges(len(layers)) if edges is None else edges):
        su, sv = stage_of[u], stage_of[v]
        if su == sv:
            continue
        a, b = costs.both(layers[u].output_shape, layers[u].dtype, stages[su].placement,
                          cands[u].output, stages[sv].placement, cands[v].input)
        if order.locate(sv - 1)[0] == order.locate(sv)[0]:  # a local handover
            fwd[sv] += a
            bwd[sv] += b
        else:
            there[sv - 1] += a
            back[sv - 1] += b
    times = PipelineCosts(forward=tuple(fwd), backward=tuple(bwd),
                          activation_transfer=tuple(there) or 0.0,
                          gradient_transfer=tuple(back) or 0.0)
    return simulate(order, times).iteration_time


def _order(choice: Choice, name: str, orders: Orders) -> Schedule:
    """The pipeline schedule ``name`` for ``choice``'s pieces (SearchError: unknown, or
    it places pieces otherwise than the choice's schedule does)."""
    v = choice.chunks
    p = len(choice.stages) // v
    mine = SearchSchedule(choice.schedule).traits.placement
    try:
        order = orders.get(name, p, choice.microbatches, v)
    except ReshardError as e:
        raise SearchError(str(e)) from None
    if order.num_chunks != v or (v > 1 and order.placement != mine):
        runs = ("a stage each" if v == 1 else f"{v} pieces each on the {mine} placement")
        raise SearchError(f"schedule {name!r} runs {order.num_chunks} chunks per stage "
                          f"(placement {order.placement}); the choice's submeshes run "
                          f"{runs}: give a schedule that places them so (gpipe, 1f1b, "
                          f"eager-1f1b or zb-h1 for a stage each)")
    return order


def rerank(layers: Sequence[Layer], choices: Sequence[Choice], cluster: Cluster,
           costs: MoveCosts | None = None,
           edges: Sequence[tuple[int, int]] | None = None,
           schedule: str | None = None,
           time_limit: float | Budget | None = None,
           orders: Orders | None = None) -> list[Choice]:
    """``choices`` (e.g. :func:`reshard.search.best_few`'s) with their ``simulated``
    time set (under their schedule, or ``schedule``: :func:`simulated`), least
    simulated time first (ties: the objective's order; a choice given twice, once);
    ``time_limit`` as a search's."""
    budget = Budget.of(time_limit)
    orders = Orders() if orders is None else orders
    timed: list[Choice] = []
    seen: set[tuple] = set()
    for c in choices:
        key = tuple((s.first, s.last, s.placement, s.choices) for s in c.stages)
        if key in seen:
            continue
        seen.add(key)
        budget.check("re-ranking choices by the pipeline simulator ({} of {} done)",
                     len(timed), len(choices))
        timed.append(dataclasses.replace(c, simulated=simulated(layers, c, cluster, costs,
                                                                edges, schedule, orders)))
    return sorted(timed, key=lambda c: (c.simulated or 0.0, c.time))


__all__ = ["FORWARD_SHARE", "rerank", "simulated"]

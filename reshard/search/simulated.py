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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from reshard.cluster import Cluster
from reshard.errors import ReshardError, SearchError
from reshard.pipeline.costs import PipelineCosts
from reshard.pipeline.generators import make_schedule
from reshard.pipeline.simulator import simulate
from reshard.search.costs import MoveCosts
from reshard.search.model import Budget, Choice, Layer
from reshard.search.objective import chain_edges, named_candidates, stage_index

FORWARD_SHARE = 1 / 3
"""A stage's forward share of its time per microbatch (the backward takes the rest)."""


def simulated(layers: Sequence[Layer], choice: Choice, cluster: Cluster,
              costs: MoveCosts | None = None,
              edges: Sequence[tuple[int, int]] | None = None,
              schedule: str | None = None) -> float:
    """``choice``'s iteration time under the simulator running its schedule, or
    ``schedule`` (any of :data:`reshard.pipeline.SCHEDULES` with one chunk per stage:
    ``gpipe``, ``1f1b``, ``eager-1f1b``, ``zb-h1``; a V or interleaved schedule puts
    several stages on one submesh, which a choice's stages, each on its own, do not)
    (module docstring); ``edges`` as :func:`reshard.search.evaluate` takes them.

    Raises:
        SearchError: a schedule with several chunks per stage, or an unknown one.
    """
    costs = MoveCosts(cluster) if costs is None else MoveCosts(cluster, False, costs.cache)
    stages = choice.stages
    stage_of = stage_index(stages)
    cands = named_candidates(layers, stages)
    there = [0.0] * max(0, len(stages) - 1)
    back = [0.0] * max(0, len(stages) - 1)
    for u, v in (chain_edges(len(layers)) if edges is None else edges):
        su, sv = stage_of[u], stage_of[v]
        if su == sv:
            continue
        a, b = costs.both(layers[u].output_shape, layers[u].dtype, stages[su].placement,
                          cands[u].output, stages[sv].placement, cands[v].input)
        there[sv - 1] += a
        back[sv - 1] += b
    per = [st.compute + st.inner for st in stages]
    times = PipelineCosts(forward=tuple(t * FORWARD_SHARE for t in per),
                          backward=tuple(t * (1 - FORWARD_SHARE) for t in per),
                          activation_transfer=tuple(there) or 0.0,
                          gradient_transfer=tuple(back) or 0.0)
    name = choice.schedule if schedule is None else schedule
    try:
        order = make_schedule(name, len(stages), choice.microbatches)
    except ReshardError as e:
        raise SearchError(str(e)) from None
    if order.num_chunks != 1:
        raise SearchError(f"schedule {name!r} runs {order.num_chunks} chunks per stage; "
                          f"a choice's stages each run one: give gpipe, 1f1b, eager-1f1b "
                          f"or zb-h1")
    return simulate(order, times).iteration_time


def rerank(layers: Sequence[Layer], choices: Sequence[Choice], cluster: Cluster,
           costs: MoveCosts | None = None,
           edges: Sequence[tuple[int, int]] | None = None,
           schedule: str | None = None,
           time_limit: float | Budget | None = None) -> list[Choice]:
    """``choices`` (e.g. :func:`reshard.search.best_few`'s) with their ``simulated``
    time set (under their schedule, or ``schedule``: :func:`simulated`), least
    simulated time first (ties: the objective's order; a choice given twice, once);
    ``time_limit`` as a search's."""
    budget = Budget.of(time_limit)
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
                                                                edges, schedule)))
    return sorted(timed, key=lambda c: (c.simulated or 0.0, c.time))


__all__ = ["FORWARD_SHARE", "rerank", "simulated"]

"""Choose pipeline stages, their submeshes and layer layouts, with every cross-mesh
move priced by reshard (:mod:`reshard.search.chain`: Alpa's stage DP with the moves
it leaves out, exact for its objective).

    from reshard.search import Candidate, Layer, search_chain
    layer = Layer("block", (8, 1024, 4096), "bfloat16",
                  {(1, 4): (Candidate("tp", 2e-3, "RRR", "RRR"),)})
    choice = search_chain([layer] * 8, Cluster.regular(2, 4), microbatches=16)
"""

from reshard.search.chain import best_few, evaluate, objective, search_chain
from reshard.search.costs import MoveCosts
from reshard.search.graph import Graph, evaluate_graph, search_graph
from reshard.search.kinds import METHODS, MOVES, SEARCH_SCHEDULES, Method, Moves, SearchSchedule
from reshard.search.memory import device_memory, in_flight, stage_memory
from reshard.search.model import Candidate, Choice, Layer, Placement, Stage, placements
from reshard.search.replicas import Replicated, search_replicated
from reshard.search.simulated import rerank, simulated

SCHEDULES = SEARCH_SCHEDULES
"""The old name of :data:`SEARCH_SCHEDULES` (``reshard.pipeline.SCHEDULES`` is the
pipeline's generators by name; this is the names the search's objective models)."""

__all__ = ["METHODS", "MOVES", "SCHEDULES", "SEARCH_SCHEDULES", "Candidate", "Choice", "Graph",
           "Layer", "Method", "MoveCosts", "Moves", "Placement", "Replicated", "SearchSchedule",
           "Stage", "best_few", "device_memory", "evaluate", "evaluate_graph", "in_flight",
           "objective", "placements", "rerank", "search_chain", "search_graph",
           "search_replicated", "simulated", "stage_memory"]

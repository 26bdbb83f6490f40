"""Choose pipeline stages, their submeshes and layer layouts, with every cross-mesh
move priced by reshard (:mod:`reshard.search.chain`: Alpa's stage DP with the moves
it leaves out, exact for its objective).

    from reshard.search import Candidate, Layer, search_chain
    layer = Layer("block", (8, 1024, 4096), "bfloat16",
                  {(1, 4): (Candidate("tp", 2e-3, "RRR", "RRR"),)})
    choice = search_chain([layer] * 8, Cluster.regular(2, 4), microbatches=16)
"""

from reshard.search.chain import MOVES, SCHEDULES, best_few, evaluate, objective, search_chain
from reshard.search.costs import MoveCosts
from reshard.search.graph import METHODS, Graph, evaluate_graph, search_graph
from reshard.search.model import Candidate, Choice, Layer, Placement, Stage, placements
from reshard.search.replicas import Replicated, search_replicated
from reshard.search.simulated import rerank, simulated

__all__ = ["METHODS", "MOVES", "SCHEDULES", "Candidate", "Choice", "Graph", "Layer",
           "MoveCosts", "Placement", "Replicated", "Stage", "best_few", "evaluate", "evaluate_graph",
           "objective", "placements", "rerank", "search_chain", "search_graph", "search_replicated", "simulated"]

"""Choose pipeline stages, their submeshes and layer layouts, with every cross-mesh
move priced by reshard (:mod:`reshard.search.chain`: Alpa's stage DP with the moves
it leaves out, exact for its objective).

    from reshard.search import Candidate, Layer, search_chain
    layer = Layer("block", (8, 1024, 4096), "bfloat16",
                  {(1, 4): (Candidate("tp", 2e-3, "RRR", "RRR"),)})
    choice = search_chain([layer] * 8, Cluster.regular(2, 4), microbatches=16)
"""

from reshard.search.chain import MOVES, SCHEDULES, evaluate, objective, search_chain
from reshard.search.costs import MoveCosts
from reshard.search.model import Candidate, Choice, Layer, Placement, Stage, placements

__all__ = ["MOVES", "SCHEDULES", "Candidate", "Choice", "Layer", "MoveCosts", "Placement",
           "Stage", "evaluate", "objective", "placements", "search_chain"]

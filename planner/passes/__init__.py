"""The planner as a chooser (was ``planner/search/``, renamed so that it is not taken
for the stage search of :mod:`reshard.search`): a strategy's first plan, then named
passes in stages that propose candidates the cost model keeps by each pass's rule
(``stages``), a candidate of tasks an earlier one had priced once (``twins``), and
all-reduce first where a partial sum's meshes coincide (``allreduce``)."""

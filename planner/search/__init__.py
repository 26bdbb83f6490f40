"""The planner as a chooser: a strategy's first plan, then named passes that propose
candidates the cost model keeps by each pass's rule (``passes``), and all-reduce first
where a partial sum's meshes coincide (``allreduce``)."""

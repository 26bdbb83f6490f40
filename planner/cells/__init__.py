"""From layouts to tasks, one tensor at a time: the unit-slice cells of a move
(:mod:`~reshard.planner.cells.decompose`), a strategy's tasks for a cell and the sender
choices that balance the NICs (``cell_tasks``, ``balance``), and the shapes a
broadcast or a partial sum may take (``trees``, ``reduce``, ``fuse``)."""

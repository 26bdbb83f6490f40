"""When a tree form passing on as a chain inside hosts is the star form's plan.

The tree passes (:mod:`reshard.planner.passes.stages`) reshape a plan's chains for each
(host shape, passing on inside a host) of :data:`~reshard.planner.cells.trees.TREE_FORMS`.
The two ways of passing on differ only where a host's entry has two or more members to
pass the pieces on to; where no chain a host shape reshapes has that, both forms give
the same tasks, and the second is the first's twin (priced once already,
:mod:`reshard.planner.passes.twins`): it need not be built again.

Proof (:mod:`reshard.planner.cells.trees`). ``treeify`` reshapes a chain for a host shape
(``_APPLIES``, which reads no ``intra``) or leaves it as it is; a reshaped chain's trees
(``_trees_of``) give each host after the root's an entry (its segment's first device)
and members (the rest of its segment, less relay-only devices); ``intra`` is read only
where the edges are laid out (``_few_edges``, ``_tree_edges``, and ``_trees_by_form``
through ``_trees_of``): a star's entry sends to each member, a chain's each member's
predecessor (the entry first) does. With at most one member per host those are the
same edge, entry -> member, and the entry's own edge comes from its parent host either
way. Every other part of a task (boxes, bytes, relay-only devices kept, step, source)
reads the edges, not ``intra``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reshard.planner.cells.trees import HostShape, Segments, reshapes
from reshard.planner.values.tasks import Task, TaskKind


def same_as_star(tasks: Sequence[Task], host: Callable[[int], int], shape: HostShape,
                 memo: Segments) -> bool:
    """Whether ``treeify(tasks, host, intra, shape)`` is the same for both ways of
    passing on inside a host: no chain ``shape`` reshapes has a host segment after its
    root's of more than two devices (its entry and one member). ``memo``: the tasks'
    host segments as the star form's ``treeify`` cut them (every chain it looked at);
    a chain missing from it answers False (unknown)."""
    broadcast = TaskKind.BROADCAST
    for t in tasks:
        if t.kind is not broadcast or t.parents:
            continue  # never reshaped
        got = memo.get(id(t))
        if got is None or got[0] is not t:
            return False
        segs = got[1]
        if any(len(seg) > 2 for seg in segs[1:]) and reshapes((t,), host, shape, memo):
            return False
    return True


__all__ = ["same_as_star"]

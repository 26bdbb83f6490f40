"""Tasks built without the frozen dataclass's ``__init__``, for the run planners below
:mod:`~reshard.planner.cells.cell_tasks` (which imports them, so they cannot import
its :func:`~reshard.planner.cells.cell_tasks.new_task`).

:class:`~reshard.planner.values.tasks.Task`'s ``__init__`` calls ``object.__setattr__``
once per field, about half of building a task; a run of 131,072 cells builds as many.
Here every slot is set by its descriptor, in the fields' order, to the same values and
the same defaults (the same as :func:`~reshard.planner.cells.cell_tasks.new_task`)."""

from __future__ import annotations

from reshard.layout import Box
from reshard.planner.values.tasks import Buffer, Task, TaskKind

FIELDS = ("kind", "tensor", "box", "root", "receivers", "nbytes", "step", "source",
          "pieces", "through", "parents", "addends", "addend_parents")
""":class:`~reshard.planner.values.tasks.Task`'s fields in order (a test holds them to
the dataclass's)."""

_new = object.__new__
_SET = tuple(getattr(Task, name).__set__ for name in FIELDS)


def chain_task(kind: TaskKind, tensor: int, box: Box, root: int, receivers: tuple[int, ...],
               nbytes: int, step: int) -> Task:
    """``Task(kind, tensor, box, root, receivers, nbytes, step)``: a send or a chain
    broadcast from the source buffer, with every other field its default."""
    t = _new(Task)
    (set_kind, set_tensor, set_box, set_root, set_receivers, set_nbytes, set_step,
     set_source, set_pieces, set_through, set_parents, set_addends, set_addend_parents) = _SET
    set_kind(t, kind)
    set_tensor(t, tensor)
    set_box(t, box)
    set_root(t, root)
    set_receivers(t, receivers)
    set_nbytes(t, nbytes)
    set_step(t, step)
    set_source(t, Buffer.SRC)
    set_pieces(t, ())
    set_through(t, ())
    set_parents(t, ())
    set_addends(t, ())
    set_addend_parents(t, ())
    return t


__all__ = ["FIELDS", "chain_task"]

"""Tasks built without the frozen dataclass's ``__init__``, for every cell planner
(:mod:`~reshard.planner.cells.cell_tasks`) and run planner (broadcast_runs, send_runs)
below them: one definition they all import.

:class:`~reshard.planner.values.tasks.Task`'s ``__init__`` calls ``object.__setattr__``
once per field, about half of building a task, and a cold estimate builds thousands
per cell planner (131,072 in a run of one-holder cells at 1,024 devices). Here every
slot is set by its descriptor, in the fields' order, to the same values and the same
defaults (tests/unit/test_new_tasks.py holds :data:`TASK_FIELDS` to the dataclass's)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from reshard.layout import Box
from reshard.planner.cells.decompose import Cell
from reshard.planner.values.tasks import Buffer, Task, TaskKind

TASK_FIELDS = ("kind", "tensor", "box", "root", "receivers", "nbytes", "step", "source",
               "pieces", "through", "parents", "addends", "addend_parents")
""":class:`~reshard.planner.values.tasks.Task`'s fields in order, as :func:`new_task`
sets them (a test holds them to the dataclass's)."""

SETTERS = tuple(getattr(Task, name).__set__ for name in TASK_FIELDS)
"""Each of :class:`~reshard.planner.values.tasks.Task`'s slots' setter, in
:data:`TASK_FIELDS`' order: what every slot-by-slot build here and in the run planners
sets a new task with."""

_new = object.__new__
(_set_kind, _set_tensor, _set_box, _set_root, _set_receivers, _set_nbytes, _set_step,
 _set_source, _set_pieces, _set_through, _set_parents, _set_addends,
 _set_addend_parents) = SETTERS


def new_task(kind: TaskKind, tensor: int, box: Box, root: int, receivers: tuple[int, ...],
             nbytes: int, step: int, *, through: tuple[int, ...] = (),
             source: Buffer = Buffer.SRC, pieces: tuple[Box, ...] = ()) -> Task:
    """``Task(kind, tensor, box, root, receivers, nbytes, step, source=source,
    pieces=pieces, through=through)`` without the frozen dataclass's ``__init__``:
    every slot set by its descriptor, in the fields' order, to the same values and the
    same defaults."""
    t = _new(Task)
    _set_kind(t, kind)
    _set_tensor(t, tensor)
    _set_box(t, box)
    _set_root(t, root)
    _set_receivers(t, receivers)
    _set_nbytes(t, nbytes)
    _set_step(t, step)
    _set_source(t, source)
    _set_pieces(t, pieces)
    _set_through(t, through)
    _set_parents(t, ())
    _set_addends(t, ())
    _set_addend_parents(t, ())
    return t


def tree_task(task: Task, box: Box, receivers: tuple[int, ...], nbytes: int,
              through: tuple[int, ...], parents: tuple[int, ...]) -> Task:
    """``Task(task.kind, task.tensor, box, task.root, receivers, nbytes, task.step,
    task.source, task.pieces, through, parents, task.addends, task.addend_parents)``
    (``task`` reshaped into a tree, :mod:`~reshard.planner.cells.trees`) without the
    frozen dataclass's ``__init__``: every slot set by its descriptor, in the fields'
    order, to the same values."""
    t = _new(Task)
    _set_kind(t, task.kind)
    _set_tensor(t, task.tensor)
    _set_box(t, box)
    _set_root(t, task.root)
    _set_receivers(t, receivers)
    _set_nbytes(t, nbytes)
    _set_step(t, task.step)
    _set_source(t, task.source)
    _set_pieces(t, task.pieces)
    _set_through(t, through)
    _set_parents(t, parents)
    _set_addends(t, task.addends)
    _set_addend_parents(t, task.addend_parents)
    return t


def moved_task(task: Task, kind: TaskKind, root: int, receivers: tuple[int, ...],
               through: tuple[int, ...], step: int, source: Buffer) -> Task:
    """``dataclasses.replace(task, kind=kind, root=root, receivers=receivers,
    through=through, step=step, source=source)`` (a chain cut where it enters its last
    host, :func:`~reshard.planner.cells.cell_tasks.fan_out`) without the frozen
    dataclass's ``__init__``: every slot set by its descriptor, in the fields' order,
    to the same values."""
    t = _new(Task)
    _set_kind(t, kind)
    _set_tensor(t, task.tensor)
    _set_box(t, task.box)
    _set_root(t, root)
    _set_receivers(t, receivers)
    _set_nbytes(t, task.nbytes)
    _set_step(t, step)
    _set_source(t, source)
    _set_pieces(t, task.pieces)
    _set_through(t, through)
    _set_parents(t, task.parents)
    _set_addends(t, task.addends)
    _set_addend_parents(t, task.addend_parents)
    return t


def broadcast_runs_tasks(run: Sequence[tuple[Cell, int, int, int]], roots: Sequence[int],
                         chains: Sequence[tuple[int, ...]], nbytes: Sequence[int]
                         ) -> list[list[Task]]:
    """``[new_task(BROADCAST, tensor, cell.box, root, chain, nb, step)]`` for each
    (cell, tensor, _, step) of ``run`` with its root, chain and bytes: the same tasks,
    each slot set in the same order, without a call per task (a run planner's
    131,072 broadcasts at 1,024 devices)."""
    return _broadcasts((c[1] for c in run), (c[0].box for c in run), (c[3] for c in run),
                       roots, chains, nbytes)


def broadcast_rows_tasks(tensor: int, boxes: Sequence[Box], steps: Sequence[int],
                         roots: Sequence[int], chains: Sequence[tuple[int, ...]],
                         nbytes: Sequence[int]) -> list[list[Task]]:
    """:func:`broadcast_runs_tasks` of a run read from a table's rows (one tensor; each
    row's box, step, root, chain and bytes): the same tasks, each slot set in the same
    order, no cell built."""
    return _broadcasts(itertools.repeat(tensor), boxes, steps, roots, chains, nbytes)


def _broadcasts(tensors: Iterable[int], boxes: Iterable[Box], steps: Iterable[int],
                roots: Iterable[int], chains: Iterable[tuple[int, ...]],
                nbytes: Iterable[int]) -> list[list[Task]]:
    """One broadcast task a slot, each slot set in :data:`TASK_FIELDS`' order: the loop
    both run planners' builds share."""
    kind, source = TaskKind.BROADCAST, Buffer.SRC
    out: list[list[Task]] = []
    new, append = _new, out.append
    for tensor, box, step, root, chain, nb in zip(tensors, boxes, steps, roots, chains, nbytes):
        t = new(Task)
        _set_kind(t, kind)
        _set_tensor(t, tensor)
        _set_box(t, box)
        _set_root(t, root)
        _set_receivers(t, chain)
        _set_nbytes(t, nb)
        _set_step(t, step)
        _set_source(t, source)
        _set_pieces(t, ())
        _set_through(t, ())
        _set_parents(t, ())
        _set_addends(t, ())
        _set_addend_parents(t, ())
        append([t])
    return out


__all__ = ["SETTERS", "TASK_FIELDS", "broadcast_rows_tasks", "broadcast_runs_tasks", "moved_task",
           "new_task", "tree_task"]

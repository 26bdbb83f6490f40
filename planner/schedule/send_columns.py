"""A planning call's tasks in the global order, before every task object is built.

The planner keeps the point-to-point slices of a large plan (every cell of an
all-to-all) as columns until the global order is known (:mod:`reshard.planner.schedule.work`).
:class:`OrderedTasks` holds that order: the few task objects planned one by one, at
their positions, and the sends as columns. It builds every task
(:meth:`OrderedTasks.tasks`, what a whole plan holds), or only one device's
(:meth:`OrderedTasks.of`, what an SPMD rank keeps), and digests the whole plan from
the columns (:meth:`OrderedTasks.sends`, :mod:`reshard.planner.values.digest`) without
building the rest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import compress, repeat

import numpy as np

from reshard.layout import Box
from reshard.planner.cells.decompose import boxes_of
from reshard.planner.cells.new_tasks import SETTERS
from reshard.planner.schedule.broadcast_columns import BroadcastColumns
from reshard.planner.values.digest import Sends, is_plain_send
from reshard.planner.values.tasks import Buffer, Task, TaskKind, communicator_groups


@dataclass(frozen=True, eq=False)
class SendColumns:
    """Sends (source shard, one receiver), column by column, in the global order.

    Attributes:
        position: each send's index in the plan.
        tensor, root, recv, nbytes, step: its task's fields.
        box_source: ``(rows', 2 * width)`` starts and stops dim by dim, zero-padded past
            ``ndim``, of the rows the sends are picked from (:attr:`box`).
        ndim: each box's rank.
        box_rows: each send's row of ``box_source`` (None: row ``i`` the ``i``-th send's).
    """

    position: np.ndarray
    tensor: np.ndarray
    root: np.ndarray
    recv: np.ndarray
    nbytes: np.ndarray
    step: np.ndarray
    box_source: np.ndarray
    ndim: np.ndarray
    box_rows: np.ndarray | None = None

    @cached_property
    def box(self) -> np.ndarray:
        """``(sends, 2 * width)``: each send's starts and stops, dim by dim, zero-padded
        past ``ndim``; gathered from :attr:`box_source` on first read (an estimate never
        reads it: only the digest does, and :meth:`boxes` reads the source itself)."""
        if self.box_rows is None:
            return self.box_source
        return np.take(self.box_source, self.box_rows, axis=0)

    def boxes(self, rows: np.ndarray) -> list[Box]:
        """The boxes of ``rows`` as tuples of (start, stop) (read from
        :attr:`box_source`: the same values as :attr:`box`'s rows)."""
        out: list[Box] = [()] * len(rows)
        ndims = self.ndim[rows]
        source = self.box_source
        for k in np.unique(ndims).tolist():
            at = np.flatnonzero(ndims == k)
            picked = rows[at] if self.box_rows is None else self.box_rows[rows[at]]
            got = boxes_of(source[picked, 0:2 * k:2], source[picked, 1:2 * k:2])
            for i, b in zip(at.tolist(), got):
                out[i] = b
        return out

    def tasks(self, rows: np.ndarray) -> list[Task]:
        """The tasks of ``rows``."""
        return send_tasks(self.tensor[rows].tolist(), self.boxes(rows),
                          self.root[rows].tolist(), self.recv[rows].tolist(),
                          self.nbytes[rows].tolist(), self.step[rows].tolist())


def send_tasks(tensor: Sequence[int], boxes: Sequence[Box], root: Sequence[int],
               recv: Sequence[int], nbytes: Sequence[int], step: Sequence[int]) -> list[Task]:
    """``[Task(SEND, tensor[i], boxes[i], root[i], (recv[i],), nbytes[i], step[i])
    for i ...]`` (one receiver tuple per device, shared) without the frozen dataclass's
    ``__init__``: the tasks made empty, then each field set on all of them by its slot's
    setter (:data:`~reshard.planner.cells.new_tasks.SETTERS`, in the fields' order), in
    C, to the same values and the same defaults."""
    n = len(root)
    tasks = list(map(object.__new__, repeat(Task, n)))
    alone = {d: (d,) for d in set(recv)}
    fields = (repeat(TaskKind.SEND, n), tensor, boxes, root, map(alone.__getitem__, recv),
              nbytes, step, repeat(Buffer.SRC, n), *(repeat((), n) for _ in range(5)))
    for setter, values in zip(SETTERS, fields, strict=True):
        deque(map(setter, tasks, values), maxlen=0)
    return tasks


class OrderedTasks:
    """Every task of a planning call in the global order: ``objects`` at
    ``positions`` (ascending), the rest ``sends``; where ``kept`` (broadcasts kept as
    columns) is given, it is at ``kept_positions`` (ascending), and :attr:`objects` and
    :attr:`positions` are every task but the sends, ``kept``'s built on first use
    (:attr:`own_objects`, :attr:`own_positions`: the others)."""

    def __init__(self, objects: list[Task], positions: list[int], sends: SendColumns,
                 kept: BroadcastColumns | None = None,
                 kept_positions: np.ndarray | None = None) -> None:
        self.own_objects = objects
        self.own_positions = positions
        self.send_columns = sends
        self.kept = kept
        self.kept_positions = np.zeros(0, dtype=np.int64) if kept_positions is None \
            else kept_positions
        self._merged: tuple[list[Task], list[int]] | None = None

    def __len__(self) -> int:
        return len(self.own_objects) + len(self.kept_positions) + len(self.send_columns.position)

    @property
    def objects(self) -> list[Task]:
        """Every task but the sends, in order (the kept broadcasts built)."""
        return self._every()[0]

    @property
    def positions(self) -> list[int]:
        """:attr:`objects`' positions, ascending."""
        return self._every()[1]

    def _every(self) -> tuple[list[Task], list[int]]:
        """:attr:`objects` and :attr:`positions`, merged once."""
        kept = self.kept
        if kept is None:
            return self.own_objects, self.own_positions
        if self._merged is None:
            at = np.concatenate([np.array(self.own_positions, dtype=np.int64),
                                 self.kept_positions])
            order = np.argsort(at, kind="stable")
            every = [*self.own_objects, *(t for (t,) in kept.tasks())]
            self._merged = [every[i] for i in order.tolist()], at[order].tolist()
        return self._merged

    def tasks(self) -> tuple[Task, ...]:
        """Every task, in order."""
        cols = self.send_columns
        if not len(cols.position):  # the objects at every position, in order
            return tuple(self.objects)
        sends = cols.tasks(np.arange(len(cols.position)))
        if not self.objects:
            return tuple(sends)
        out: list[Task | None] = [None] * len(self)
        for pos, t in zip(self.positions, self.objects):
            out[pos] = t
        for pos, t in zip(cols.position.tolist(), sends):
            out[pos] = t
        return tuple(out)  # type: ignore[arg-type]

    def of(self, device: int) -> list[tuple[int, Task]]:
        """``device``'s ``(index, task)`` pairs, in order; only these are built."""
        cols = self.send_columns
        rows = np.flatnonzero((cols.root == device) | (cols.recv == device))
        mine = list(zip(cols.position[rows].tolist(), cols.tasks(rows)))
        mine += [(pos, t) for pos, t in zip(self.positions, self.objects)
                 if t.root == device or device in t.receivers or device in t.addends]
        mine.sort(key=lambda pair: pair[0])
        return mine

    def groups(self) -> tuple[tuple[int, ...], ...]:
        """The plan's communicator groups (:func:`~reshard.planner.values.tasks.
        communicator_groups`: sends have none, so the objects hold them all)."""
        return communicator_groups(self.objects)

    def sends(self) -> tuple[Sends, list[int], list[Task]]:
        """The digest's parts (:func:`reshard.planner.values.digest.digest`): the plain sends
        as columns, the other tasks and their positions."""
        cols = self.send_columns
        plain = list(map(is_plain_send, self.objects))
        other = [not p for p in plain]
        extra = Sends.of_tasks(list(compress(self.positions, plain)),
                               list(compress(self.objects, plain)))
        own = cols.box.reshape(len(cols.position), cols.box.shape[1] // 2, 2)
        width = max(own.shape[1], extra.box.shape[1])
        box = np.zeros((len(own) + len(extra.box), width, 2), dtype=np.int64)
        box[:len(own), :own.shape[1]] = own
        box[len(own):, :extra.box.shape[1]] = extra.box
        ints = np.concatenate([np.stack([cols.position, cols.tensor, cols.root, cols.recv,
                                         cols.nbytes, cols.step], axis=1).reshape(-1, 6),
                               extra.ints])
        return (Sends(ints, np.concatenate([cols.ndim, extra.ndim]), box),
                list(compress(self.positions, other)), list(compress(self.objects, other)))


__all__ = ["OrderedTasks", "SendColumns", "send_tasks"]

"""A run of broadcasts planned from a table's rows, kept as columns in the global order.

A partial source's reduced pieces sent to every destination host are 131,072
broadcasts at 1,024 devices (:mod:`~reshard.planner.schedule.kept_rows`), each one root
and a chain of receivers on one other host, no parents, no addends, read from the
source. :class:`BroadcastColumns` keeps them as columns (each one's table row, root,
chain, bytes and step) from the run planner to the ordered plan
(:class:`~reshard.planner.schedule.send_columns.OrderedTasks`): the cost model prices
them from the columns (:mod:`~reshard.planner.costing.columns`), and anything that
reads them as tasks gets the tasks :func:`~reshard.planner.cells.new_tasks.
broadcast_rows_tasks` builds of the same values (:meth:`BroadcastColumns.tasks`, built
once)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from reshard.planner.cells.decompose import CellTable
from reshard.planner.cells.new_tasks import broadcast_rows_tasks
from reshard.planner.values.tasks import Task


@dataclass(frozen=True, eq=False)
class BroadcastColumns(Sequence[list[Task]]):
    """Broadcasts of tensor ``tensor``, one a row: task ``i``'s box is ``table``'s row
    ``row[i]``, its root ``root[i]``, its receivers ``chains[chain[i]]``, its bytes
    ``nbytes[i]``, its step ``step[i]``. Read as a sequence, each task in a list (a
    run planner's answer: :meth:`tasks`)."""

    tensor: int
    table: CellTable
    row: np.ndarray
    root: np.ndarray
    chain: np.ndarray
    chains: list[tuple[int, ...]]
    nbytes: np.ndarray
    step: np.ndarray
    _built: list[list[Task]] = field(default_factory=list, repr=False)
    _taken: tuple[BroadcastColumns, np.ndarray] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, tensor: int, table: CellTable, rows: np.ndarray, roots: list[int],
           chains: list[tuple[int, ...]], nbytes: list[int], steps: list[int]
           ) -> BroadcastColumns:
        """The columns of the tasks ``broadcast_rows_tasks(tensor, table.boxes(rows),
        steps, roots, chains, nbytes)`` (each distinct chain object kept once)."""
        ids = np.fromiter(map(id, chains), dtype=np.int64, count=len(chains))
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        return cls(tensor, table, np.asarray(rows, dtype=np.int64),
                   np.array(roots, dtype=np.int64), inverse.reshape(-1),
                   [chains[f] for f in first.tolist()], np.array(nbytes, dtype=np.int64),
                   np.array(steps, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.root)

    def __getitem__(self, i: int) -> list[Task]:  # type: ignore[override]
        return self.tasks()[i]

    def __iter__(self) -> Iterator[list[Task]]:
        return iter(self.tasks())

    def take(self, order: np.ndarray) -> BroadcastColumns:
        """The tasks at ``order``, in that order."""
        return BroadcastColumns(self.tensor, self.table, self.row[order], self.root[order],
                                self.chain[order], self.chains, self.nbytes[order],
                                self.step[order], _taken=(self, order))

    def tasks(self) -> list[list[Task]]:
        """Each task (one a list, as a run planner answers), built once: the same tasks
        as :func:`~reshard.planner.cells.new_tasks.broadcast_rows_tasks` of the
        values (of columns taken from others, the same objects as theirs)."""
        if self._built or not len(self):
            return self._built
        if self._taken is not None:
            whole, order = self._taken
            built = whole.tasks()
            self._built.extend([built[i] for i in order.tolist()])
        else:
            chains = self.chains
            self._built.extend(broadcast_rows_tasks(
                self.tensor, self.table.boxes(self.row), self.step.tolist(),
                self.root.tolist(), [chains[k] for k in self.chain.tolist()],
                self.nbytes.tolist()))
        return self._built

    def task(self, i: int) -> Task:
        """Task ``i`` (built alone where :meth:`tasks` has not built them all)."""
        if self._built:
            return self._built[i][0]
        one = np.array([i], dtype=np.int64)
        return BroadcastColumns(self.tensor, self.table, self.row[one], self.root[one],
                                self.chain[one], self.chains, self.nbytes[one],
                                self.step[one]).tasks()[0][0]

    def devices(self) -> np.ndarray | None:
        """Each task's root and receivers, as rows, where every chain has one length;
        else None."""
        lengths = {len(c) for c in self.chains}
        if len(lengths) != 1:
            return None
        rows = np.empty((len(self), lengths.pop() + 1), dtype=np.int64)
        rows[:, 0] = self.root
        rows[:, 1:] = np.array(self.chains, dtype=np.int64).reshape(len(self.chains), -1)[
            self.chain]
        return rows


__all__ = ["BroadcastColumns"]

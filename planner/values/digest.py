"""The plan digest: the SHA-256 of a plan's content, the same whether it is computed
from the plan's tasks (:meth:`reshard.planner.ir.ReshardPlan.digest`) or from the
planner's columns before any task object exists (:mod:`reshard.planner.share`, an SPMD
rank that keeps only its own tasks).

What is hashed, in this order: the plan's header (format, strategy, cluster, tensors)
as sorted JSON; the *plain sends* (a ``SEND`` from the source shard to one receiver,
nothing else set: every task of an all-to-all) as little-endian int64 columns
``(index, tensor, root, receiver, nbytes, step)`` and their boxes ``(rows, ndim, 2)``,
grouped by the boxes' rank (ranks ascending, indices ascending within one); then every
other task, with its index, pickled field by field (ints and tuples of ints: the same
bytes in every process, whatever its hash seed; enums by value). Equal plans digest
equal in any process; two plans that differ in any task field digest differently.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
from collections.abc import Sequence
from itertools import compress
from operator import attrgetter
from typing import Any

import numpy as np

from reshard.planner.values.tasks import Buffer, Task, TaskKind

CHUNK = 1 << 16
"""Other tasks pickled at a time."""

_FIELDS = attrgetter("tensor", "box", "root", "receivers", "nbytes", "step", "pieces",
                     "through", "parents", "addends", "addend_parents")
"""A task's fields but its two enums (spelled by value)."""

_SEND = TaskKind.SEND
_SRC = Buffer.SRC


def is_plain_send(t: Task) -> bool:
    """A ``SEND`` from the source shard to one receiver with nothing else set."""
    return (t.kind is _SEND and t.source is _SRC and len(t.receivers) == 1
            and not (t.pieces or t.through or t.parents or t.addends or t.addend_parents))


class Sends:
    """Plain sends as columns: ``ints`` ``(rows, 6)`` = index, tensor, root, receiver,
    nbytes, step; ``boxes`` per rank ``(rows, ndim, 2)`` with the rows' positions in
    ``ints``."""

    def __init__(self, ints: np.ndarray, ndim: np.ndarray, box: np.ndarray) -> None:
        """``box``: ``(rows, width, 2)`` starts and stops, zero-padded past each row's
        ``ndim``; rows in any order (sorted by index here)."""
        order = np.argsort(ints[:, 0], kind="stable")
        self.ints = np.ascontiguousarray(ints[order], dtype="<i8")
        self.ndim = ndim[order]
        self.box = box[order]

    @classmethod
    def of_tasks(cls, indices: Sequence[int], tasks: Sequence[Task]) -> Sends:
        """The columns of plain sends ``tasks`` at plan positions ``indices``."""
        ints = np.array([(i, t.tensor, t.root, t.receivers[0], t.nbytes, t.step)
                         for i, t in zip(indices, tasks)], dtype=np.int64).reshape(-1, 6)
        ndims = np.array([len(t.box) for t in tasks], dtype=np.int64)
        width = int(ndims.max()) if len(ndims) else 0
        box = np.zeros((len(tasks), width, 2), dtype=np.int64)
        for k in np.unique(ndims).tolist():
            sel = np.flatnonzero(ndims == k)
            if k:
                box[sel, :k] = np.array([tasks[i].box for i in sel.tolist()],
                                        dtype=np.int64).reshape(len(sel), k, 2)
        return cls(ints, ndims, box)

    def update(self, h: hashlib._Hash) -> None:
        """Hash the columns into ``h``."""
        h.update(b"sends")
        for k in np.unique(self.ndim).tolist():
            sel = self.ndim == k
            h.update(np.array([k, int(sel.sum())], dtype="<i8").tobytes())
            h.update(np.ascontiguousarray(self.ints[sel], dtype="<i8").tobytes())
            h.update(np.ascontiguousarray(self.box[sel][:, :k], dtype="<i8").tobytes())


def _others_bytes(indices: Sequence[int], tasks: Sequence[Task]) -> bytes:
    """A pickle of ``tasks``' fields and positions, without the memo (``fast``: nothing
    in it repeats by reference or refers to itself)."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5)
    pickler.fast = True
    pickler.dump((list(indices), [t.kind._value_ for t in tasks],
                  [t.source._value_ for t in tasks], list(map(_FIELDS, tasks))))
    return out.getvalue()


def digest(header: dict[str, Any], sends: Sends, other_indices: Sequence[int],
           others: Sequence[Task]) -> bytes:
    """The digest of a plan whose header is ``header``, whose plain sends are
    ``sends`` and whose other tasks are ``others`` at positions ``other_indices``
    (ascending)."""
    h = hashlib.sha256()
    h.update(json.dumps(header, sort_keys=True).encode())
    sends.update(h)
    h.update(b"others")
    for k in range(0, len(others), CHUNK):
        h.update(_others_bytes(other_indices[k:k + CHUNK], others[k:k + CHUNK]))
    return h.digest()


def digest_tasks(header: dict[str, Any], tasks: Sequence[Task]) -> bytes:
    """:func:`digest` of a plan's tasks, in its order."""
    plain = list(map(is_plain_send, tasks))
    indices = range(len(tasks))
    other = [not p for p in plain]
    return digest(header, Sends.of_tasks(list(compress(indices, plain)),
                                         list(compress(tasks, plain))),
                  list(compress(indices, other)), list(compress(tasks, other)))


__all__ = ["CHUNK", "Sends", "digest", "digest_tasks", "is_plain_send"]

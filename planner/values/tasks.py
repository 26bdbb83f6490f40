"""The plan IR's value types: tasks with global boxes, the planned tensors, and their
JSON forms (the frozen plan that holds them is :mod:`reshard.planner.ir`).

Execution semantics (every backend implements exactly this; the ``local`` backend is
the reference). Each device holds up to two shards of every planned tensor: ``src``
(its shard of the source layout) and ``dst`` (its shard of the destination layout,
initially zeros). Boxes are global; a device addresses them relative to its shard.

* ``COPY``: ``dst[box] = src[box]`` on device ``root`` (``receivers == (root,)``).
* ``SEND``: ``receivers[0].dst[box] = root.<source>[box]``.
* ``BROADCAST``: every receiver's ``dst[box] = root.<source>[box]``, except the
  receivers listed in ``through``: relays that receive the box into scratch memory,
  pass it on down the chain and keep nothing (a device whose NIC is idle, as NCCL's
  PXN routes through a peer GPU's NIC). The bytes flow down a pipelined chain
  ``root -> receivers[0] -> receivers[1] ...``, or, when ``parents`` is given, down a
  pipelined tree: ``receivers[i]`` receives from ``parents[i]`` (the root or an
  earlier receiver) and passes each piece on to every receiver whose parent it is.
  A broadcast with ``addends`` broadcasts a partial sum as it is reduced (a reduction
  fused with its delivery): first ``root.src[box] = sum(d.src[box] for d in
  (*addends, root))`` as a ``REDUCE`` does (the root's private copy), each piece summed
  down the chain ``addends[0] -> addends[1] -> ... -> root`` (or, when
  ``addend_parents`` is given, up a tree: ``addends[i]`` adds the running sums its
  children passed it to its own and passes the result to ``addend_parents[i]``, the root
  or another addend; a star when every parent is the root) and passed on to the
  receivers as soon as the root added its own; ``source`` is ``src``.
* ``REDUCE``: ``root.src[box] = sum(d.src[box] for d in (root, *receivers))``; the root
  works on a private copy of its source shard, so the caller's data is untouched.
* ``ALLGATHER``: member ``receivers[i]`` holds ``pieces[i]`` in its ``dst``; afterwards
  every member holds every piece in its ``dst``.
* ``ALLREDUCE``: the sum ``sum(d.src[box] for d in receivers)`` (over one whole
  partial group; ``root`` is ``-1``) lands on every member ``m``: in ``m.dst[box]``
  where ``m``'s destination shard holds the box (:func:`delivers`), else in ``m``'s
  private copy of its source shard (as a ``REDUCE`` root's), for later tasks to read.
  It is the backend's all-reduce (e.g. a ring), summing in place in the destination
  where it can; a backend without one runs it as a ``REDUCE`` into ``receivers[0]``
  and a broadcast of the sum.

Steps: tasks with the same ``step`` form a group, and steps never decrease along the
plan's tuple order. On each device every task of one step is issued together and may be
in flight at once (one NCCL group; gloo's asynchronous operations); the device starts
its next step when all its tasks of this one completed. A task reads only data that was
complete before its step began (a box reduced or received in an earlier step), so
tasks of one step never depend on each other. Workers issue the tasks they take part
in, in the plan's global order (the tuple order); since every worker follows one
order, no set of blocking collectives can deadlock, and a backend that runs a step's
operations one at a time in that order is still correct (only slower).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from reshard.dtypes import ReduceOp, ScaleMode, accumulator, itemsize
from reshard.errors import PlanError
from reshard.layout import Box, Layout, box_size

FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)
"""Format 1: one task per device and step (each task blocking); format 2: steps are
concurrent groups. A format-1 plan is a valid format-2 plan."""


class TaskKind(enum.Enum):
    """What a task does (see the module docstring for exact semantics)."""

    COPY = "copy"
    SEND = "send"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLGATHER = "allgather"
    ALLREDUCE = "allreduce"

    # members compare by identity: hashed by it too, in C (a task's hash and a route's
    # key read it per task; no order of the planner depends on a hash)
    __hash__ = object.__hash__


SUMMING = frozenset({TaskKind.REDUCE, TaskKind.ALLREDUCE})
"""Kinds that carry a partial sum's addends, in its accumulator (the other kinds carry
the destination dtype)."""


def delivers(dst_box: Box | None, box: Box) -> bool:
    """Whether an ``ALLREDUCE`` of ``box`` delivers its sum into a member's destination
    shard (``dst_box``; None: it has none): where the shard holds the whole box."""
    return dst_box is not None and all(a <= lo and hi <= b for (lo, hi), (a, b)
                                       in zip(box, dst_box))


def allreduce_parts(task: Task) -> tuple[Task, Task]:
    """An ``ALLREDUCE`` as a backend without an all-reduce runs it: the ``REDUCE`` of its
    box into its first member, then the broadcast of the sum to the others (the second
    part keeps the all-reduce's kind: its receivers keep the sum in their source
    copies, not their destinations)."""
    if task.kind is not TaskKind.ALLREDUCE:
        raise PlanError(f"task ({task}) is not an all-reduce")
    first, rest = task.receivers[0], task.receivers[1:]
    return (Task(TaskKind.REDUCE, task.tensor, task.box, first, rest, task.nbytes, task.step),
            replace(task, root=first, receivers=rest))


class Buffer(enum.Enum):
    """Which shard a task's root reads from."""

    SRC = "src"
    DST = "dst"

    __hash__ = object.__hash__  # as TaskKind's

OPTIONAL_FIELDS = ("pieces", "through", "parents", "addends", "addend_parents")
"""A task's fields its JSON form leaves out where they are empty."""


def task_dict(fields: dict[str, Any]) -> dict[str, Any]:
    """A task's JSON form from all its fields (as lists): the optional ones
    (:data:`OPTIONAL_FIELDS`) only where they are not empty."""
    return {k: v for k, v in fields.items() if v or k not in OPTIONAL_FIELDS}


@dataclass(frozen=True, slots=True)
class Task:
    """One step of a plan.

    Attributes:
        kind: the operation.
        tensor: index of the tensor in :attr:`ReshardPlan.tensors`.
        box: the global box moved (for ``ALLGATHER``, the union of the pieces).
        root: sending / reducing device; ``-1`` for ``ALLGATHER`` and ``ALLREDUCE``.
        receivers: receiving devices (``REDUCE``: contributing devices; ``ALLGATHER``
            and ``ALLREDUCE``: members).
        nbytes: bytes of ``box``.
        step: the group of the global order this task belongs to (see the module
            docstring): a device's tasks of one step run concurrently.
        source: the shard the root reads from.
        pieces: ``ALLGATHER`` only: each member's piece.
        through: ``BROADCAST`` only: receivers that only relay the box (never the last
            of the chain; in a tree, never a leaf); they need no shard of the tensor.
        parents: ``BROADCAST`` only, empty for a chain: the device each receiver
            receives from (the root or an earlier receiver), one per receiver.
        addends: ``BROADCAST`` only: the other addends of a partial sum the root
            reduces while it broadcasts it, in chain order (empty: the box is read
            as it is).
        addend_parents: with ``addends`` only, empty for their chain: the device each
            addend passes its running sum to (the root or another addend), one per
            addend.
    """

    kind: TaskKind
    tensor: int
    box: Box
    root: int
    receivers: tuple[int, ...]
    nbytes: int
    step: int = 0
    source: Buffer = Buffer.SRC
    pieces: tuple[Box, ...] = ()
    through: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    addends: tuple[int, ...] = ()
    addend_parents: tuple[int, ...] = ()

    def edges(self) -> tuple[tuple[int, int], ...]:
        """A ``SEND`` / ``BROADCAST`` as (sender, receiver) pairs in receiver order:
        the chain ``root -> receivers[0] -> ...``, or the tree of :attr:`parents`."""
        if self.parents:
            return tuple(zip(self.parents, self.receivers))
        return tuple(zip((self.root, *self.receivers), self.receivers))

    def sum_edges(self) -> tuple[tuple[int, int], ...]:
        """A fused sum's (addend, device it passes its running sum to) pairs, every
        addend's edge after those of the addends it receives from: the chain
        ``addends[0] -> ... -> root``, or the tree of :attr:`addend_parents` (deepest
        addends first). Empty without addends."""
        targets = sum_targets(self.root, self.addends, self.addend_parents)
        if not self.addend_parents:
            return tuple(zip(self.addends, targets))
        parent = dict(zip(self.addends, targets))
        # deepest first (a cycle, which the verifier refuses, counts as no hops)
        order = sorted(range(len(self.addends)),
                       key=lambda i: -(sum_hops(self.root, parent, self.addends[i]) or 0))
        return tuple((self.addends[i], targets[i]) for i in order)

    def parts(self) -> tuple[Task, Task]:
        """A broadcast with ``addends`` as what it fuses: the ``REDUCE`` of its box
        into the root, and the plain broadcast of the sum (for backends that run them
        one after the other)."""
        if not self.addends:
            raise PlanError(f"task ({self}) sums no addends; it has no parts")
        return (Task(TaskKind.REDUCE, self.tensor, self.box, self.root, self.addends,
                     self.nbytes, self.step),
                replace(self, addends=(), addend_parents=()))

    def at_step(self, step: int) -> Task:
        """This task in step ``step`` (``replace(self, step=step)``, built directly: a
        budget renumbers every task of plans of tens of thousands)."""
        if step == self.step:
            return self
        return Task(self.kind, self.tensor, self.box, self.root, self.receivers, self.nbytes,
                    step, self.source, self.pieces, self.through, self.parents, self.addends,
                    self.addend_parents)

    @property
    def devices(self) -> tuple[int, ...]:
        """Every device taking part, root first."""
        if self.root < 0 or self.kind is TaskKind.COPY:
            return self.receivers
        return (self.root, *self.receivers, *self.addends)

    @property
    def group(self) -> tuple[int, ...]:
        """The member set of the collective, sorted (the communicator key)."""
        return tuple(sorted(set(self.devices)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return task_dict({
            "kind": self.kind.value, "tensor": self.tensor, "box": [list(b) for b in self.box],
            "root": self.root, "receivers": list(self.receivers), "nbytes": self.nbytes,
            "step": self.step, "source": self.source.value,
            "pieces": [[list(b) for b in p] for p in self.pieces], "through": list(self.through),
            "parents": list(self.parents), "addends": list(self.addends),
            "addend_parents": list(self.addend_parents)})

    @classmethod
    def from_dict(cls, d: Any) -> Task:
        """Inverse of :meth:`to_dict`; strict about types (no float or string numbers)."""
        d = _obj(d, "task")
        return cls(
            _enum(TaskKind, _get(d, "kind", "task"), "task kind"),
            _int(_get(d, "tensor", "task"), "task tensor"),
            _box(_get(d, "box", "task"), "task box"),
            _int(_get(d, "root", "task"), "task root"),
            _ints(_get(d, "receivers", "task"), "task receivers"),
            _int(_get(d, "nbytes", "task"), "task nbytes"),
            _int(d.get("step", 0), "task step"),
            _enum(Buffer, d.get("source", "src"), "task source"),
            tuple(_box(p, "task piece") for p in _list(d.get("pieces", []), "task pieces")),
            _ints(d.get("through", []), "task through"),
            _ints(d.get("parents", []), "task parents"),
            _ints(d.get("addends", []), "task addends"),
            _ints(d.get("addend_parents", []), "task addend_parents"),
        )

    def __str__(self) -> str:
        box = "x".join(f"{a}:{b}" for a, b in self.box)
        summed = f"sum{list(self.addends)}+" if self.addends else ""
        if self.addend_parents:
            summed = f"sum{list(self.addends)}->{list(self.addend_parents)}+"
        return (f"[{self.step}] {self.kind.value} t{self.tensor} [{box}] "
                f"{summed}{self.root}->{list(self.receivers)} {self.nbytes}B")


def sum_targets(root: int, addends: Sequence[int],
                addend_parents: Sequence[int] | None = ()) -> tuple[int, ...]:
    """Where each of a fused sum's addends passes its running sum: its parent in
    ``addend_parents``, or (empty: a chain) the next addend, the last one the root."""
    return tuple(addend_parents or (*addends[1:], root))


def sum_hops(root: int, parent: Mapping[int, int], addend: int) -> int | None:
    """Hops from ``addend`` up ``parent`` (addend -> the device it passes its running
    sum to) to ``root``; None where they never reach it (a cycle, or a parent that is
    neither the root nor an addend)."""
    hops = 0
    while addend != root:
        if addend not in parent or hops >= len(parent):  # acyclic: at most one per addend
            return None
        addend, hops = parent[addend], hops + 1
    return hops


def _obj(raw: Any, what: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise PlanError(f"{what} must be a JSON object, got {type(raw).__name__}: {raw!r:.60}")
    return raw


def _get(d: dict[str, Any], key: str, what: str) -> Any:
    if key not in d:
        raise PlanError(f"{what} has no field {key!r} (fields: {sorted(d)})")
    return d[key]


def _list(raw: Any, what: str) -> list[Any]:
    if not isinstance(raw, list):
        raise PlanError(f"{what} must be a JSON list, got {type(raw).__name__}: {raw!r:.60}")
    return raw


def _int(raw: Any, what: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise PlanError(f"{what} must be an integer, got {type(raw).__name__} {raw!r:.60}")
    return raw


def _ints(raw: Any, what: str) -> tuple[int, ...]:
    return tuple(_int(v, what) for v in _list(raw, what))


def _enum(cls: Any, raw: Any, what: str) -> Any:
    try:
        return cls(raw)
    except (ValueError, TypeError):
        raise PlanError(f"{what} {raw!r:.60} is not one of "
                        f"{[m.value for m in cls]}") from None


def _box(raw: Any, what: str = "box") -> Box:
    out = []
    for pair in _list(raw, what):
        lo_hi = _list(pair, what)
        if len(lo_hi) != 2:
            raise PlanError(f"{what} entries are [start, stop] pairs, got {pair!r:.60}")
        out.append((_int(lo_hi[0], what), _int(lo_hi[1], what)))
    return tuple(out)


class Derive(enum.Enum):
    """Where a tensor's source shards come from (see the module docstring)."""

    NONE = "none"  # the caller's array
    AMAX = "amax"  # max |x| per block of tensor ``link``'s source shard (a partial max)
    SCALES = "scales"  # scales of the amax in tensor ``link``'s destination shard
    OWN_SCALES = "own_scales"  # scales of the blocks of tensor ``link``'s own source shard


class Conversion:
    """What a plan's :class:`TensorSpec` and a program's tensor share: the dtypes a
    tensor is read in, carried in and reduced in (:mod:`reshard.dtypes`)."""

    shape: tuple[int, ...]
    dtype: str
    cast: str
    scale: ScaleMode
    derive: Derive
    link: int
    fold: bool

    def conversion_dict(self) -> dict[str, Any]:
        """The JSON fields of the conversion, those that are set (a tensor without one
        writes none, so older readers read it)."""
        d: dict[str, Any] = {}
        if self.cast:
            d["cast"] = self.cast
        if self.scale is not ScaleMode.NONE:
            d["scale"] = self.scale.value
        if self.derive is not Derive.NONE:
            d["derive"] = self.derive.value
        if self.link >= 0:
            d["link"] = self.link
        if self.fold:
            d["fold"] = True
        return d

    @staticmethod
    def conversion_of(d: dict[str, Any], what: str = "tensor"
                      ) -> tuple[str, ScaleMode, Derive, int, bool]:
        """``(cast, scale, derive, link, fold)`` of a JSON form (:meth:`conversion_dict`);
        strict about types."""
        cast = d.get("cast", "")
        if not isinstance(cast, str):
            raise PlanError(f"{what} cast must be a dtype name such as 'bfloat16', got "
                            f"{cast!r:.60}")
        fold = d.get("fold", False)
        if not isinstance(fold, bool):
            raise PlanError(f"{what} fold must be true or false, got {fold!r:.60}")
        return (cast, _enum(ScaleMode, d.get("scale", "none"), f"{what} scale"),
                _enum(Derive, d.get("derive", "none"), f"{what} derive"),
                _int(d.get("link", -1), f"{what} link"), fold)

    @property
    def out_dtype(self) -> str:
        """The destination dtype (the wire's)."""
        return self.cast or self.dtype

    @property
    def sum_dtype(self) -> str | None:
        """The dtype a partial source is reduced in (None: not summable)."""
        return accumulator(self.dtype)

    @property
    def needs_scales(self) -> bool:
        """Its tasks read (or make) a scaled cast's scales: a scaled tensor or its
        scales; they run after every amax of the plan."""
        return self.scale is not ScaleMode.NONE or self.derive in (Derive.SCALES,
                                                                   Derive.OWN_SCALES)

    @property
    def reduce_op(self) -> ReduceOp:
        """How a partial source's addends combine: a max (an amax) or a sum."""
        return ReduceOp.MAX if self.derive is Derive.AMAX else ReduceOp.SUM

    @property
    def fuses(self) -> bool:
        """A reduction of this tensor may be fused with its delivery (the sum needs no
        conversion: one dtype on the whole way, and an ordinary sum)."""
        return self.reduce_op is ReduceOp.SUM and \
            self.sum_dtype == self.dtype == self.out_dtype

    @property
    def itemsize(self) -> int:
        """Bytes per element on the wire (the destination dtype's)."""
        return itemsize(self.out_dtype)

    @property
    def sum_itemsize(self) -> int:
        """Bytes per element of a reduction's messages (the accumulator's)."""
        acc = self.sum_dtype
        return itemsize(self.dtype if acc is None else acc)


@dataclass(frozen=True)
class TensorSpec(Conversion):
    """One tensor of a plan: its global shape, dtype and the two layouts.

    Attributes:
        shape: the global shape.
        dtype: the source dtype's name (:mod:`reshard.dtypes`).
        src: the source layout.
        dst: the destination layout.
        cast: the destination dtype when the reshard converts (empty: ``dtype``); what
            every transfer but a reduction carries.
        scale: how a cast to float8 is scaled; the scales are tensor ``link``'s source
            shard on the device that packs.
        derive: the source is computed on each device, not given (the tensors a scaled
            cast adds: module docstring).
        link: the tensor ``scale`` or ``derive`` refers to (-1: none).
        fold: ``scale``'s 128 x 128 blocks are those of the 2-D projection
            (:class:`reshard.dtypes.Cast`'s ``fold``).
    """

    shape: tuple[int, ...]
    dtype: str
    src: Layout
    dst: Layout
    cast: str = ""
    scale: ScaleMode = ScaleMode.NONE
    derive: Derive = Derive.NONE
    link: int = -1
    fold: bool = False

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor on the wire."""
        return box_size(tuple((0, s) for s in self.shape)) * self.itemsize

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (conversion fields only when set)."""
        return {"shape": list(self.shape), "dtype": self.dtype, "src": self.src.to_dict(),
                "dst": self.dst.to_dict(), **self.conversion_dict()}

    @classmethod
    def from_dict(cls, d: Any) -> TensorSpec:
        """Inverse of :meth:`to_dict`; strict about types."""
        d = _obj(d, "tensor")
        dtype = _get(d, "dtype", "tensor")
        if not isinstance(dtype, str):
            raise PlanError(f"tensor dtype must be a string such as 'float32', got {dtype!r:.60}")
        return cls(_ints(_get(d, "shape", "tensor"), "tensor shape"), dtype,
                   Layout.from_dict(_obj(_get(d, "src", "tensor"), "tensor src")),
                   Layout.from_dict(_obj(_get(d, "dst", "tensor"), "tensor dst")),
                   *cls.conversion_of(d))

    def __str__(self) -> str:
        conv = f"->{self.cast}" if self.cast else ""
        if self.scale is not ScaleMode.NONE:
            conv += f"/{self.scale.value}" + ("/fold" if self.fold else "")
        if self.derive is not Derive.NONE:
            conv += f" ({self.derive.value} of t{self.link})"
        return f"{self.shape} {self.dtype}{conv} {self.src} -> {self.dst}"


def communicator_groups(tasks: Iterable[Task]) -> tuple[tuple[int, ...], ...]:
    """Distinct member sets of ``tasks``' collectives, in first-use order (a broadcast
    summing addends counts as its :meth:`Task.parts`, which a backend that runs them
    apart makes communicators for); sends and copies have none."""
    seen: dict[tuple[int, ...], None] = {}
    collective = (TaskKind.BROADCAST, TaskKind.REDUCE, TaskKind.ALLGATHER, TaskKind.ALLREDUCE)
    for t in tasks:
        if t.addends:
            for part in t.parts():
                seen.setdefault(part.group, None)
        elif t.kind in collective:
            seen.setdefault(t.group, None)
    return tuple(seen)


def input_indices(tensors: Sequence[TensorSpec]) -> tuple[int, ...]:
    """Indices of a plan's tensors whose sources the caller gives (not derived)."""
    return tuple(i for i, t in enumerate(tensors) if t.derive is Derive.NONE)


def output_indices(tensors: Sequence[TensorSpec]) -> tuple[int, ...]:
    """Indices of a plan's tensors a caller receives: the inputs, then the scales of
    scaled casts (an amax is internal to the plan)."""
    return input_indices(tensors) + tuple(
        i for i, t in enumerate(tensors) if t.derive in (Derive.SCALES, Derive.OWN_SCALES))

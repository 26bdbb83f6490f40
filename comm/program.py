"""A worker program: one device's slice of a plan, all it needs to run its part.

A plan names every task of every device; a process that runs one device needs only
its own tasks, the boxes of its shards, and the communicator member sets of the
whole plan (a backend whose communicators are created by every rank of the world
creates them all, in the plan's first-use order, even the ones it is not in). A
:class:`WorkerProgram` is that slice: a frozen value, cut from a verified plan with
:meth:`WorkerProgram.of`, that serialises to JSON and back without loss, so a driver
can ship each process only its program (Alpa's per-worker task lists).

A program cannot prove alone that the plan it was cut from delivers every element
exactly once (that takes every device's tasks): :meth:`WorkerProgram.of` verifies the
whole plan first, and :meth:`WorkerProgram.check` (run by the executor on load)
checks what a single device can: its tasks involve it, name existing tensors, and
read and write inside the shards it holds.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from reshard.core.dtypes import ScaleMode, parse_dtype
from reshard.core.errors import PlanError
from reshard.core.gcpause import paused
from reshard.core.layout import Box
from reshard.planner.ir import ReshardPlan
from reshard.planner.share import PlanShare, tasks_of
from reshard.planner.values.tasks import Buffer, Conversion, Derive, Task, TaskKind, TensorSpec

PROGRAM_FORMAT = 1


@dataclass(frozen=True)
class ProgramTensor(Conversion):
    """One planned tensor as a device sees it.

    Attributes:
        shape: the global shape.
        dtype: the dtype name.
        src_box: the global box of this device's source shard (None: it holds none).
        dst_box: the global box of its destination shard (None: it receives none).
        dst_fill: its destination shard starts as zeros and no task writes it (an
            addend of a partial-sum destination other than the first).
        cast, scale, derive, link, fold: as the plan's
            :class:`~reshard.planner.ir.TensorSpec` says.
    """

    shape: tuple[int, ...]
    dtype: str
    src_box: Box | None
    dst_box: Box | None
    dst_fill: bool = False
    cast: str = ""
    scale: ScaleMode = ScaleMode.NONE
    derive: Derive = Derive.NONE
    link: int = -1
    fold: bool = False

    def to_dict(self) -> dict:
        """JSON-ready form (conversion fields only when set)."""
        return {"shape": list(self.shape), "dtype": self.dtype,
                "src": None if self.src_box is None else [list(b) for b in self.src_box],
                "dst": None if self.dst_box is None else [list(b) for b in self.dst_box],
                "fill": self.dst_fill, **self.conversion_dict()}

    @classmethod
    def from_dict(cls, d: Any) -> ProgramTensor:
        """Inverse of :meth:`to_dict`."""
        def box(raw: Any) -> Box | None:
            if raw is None:
                return None
            return tuple((int(a), int(b)) for a, b in raw)

        return cls(tuple(int(n) for n in d["shape"]), str(d["dtype"]), box(d["src"]),
                   box(d["dst"]), bool(d.get("fill", False)),
                   *cls.conversion_of(d, "program tensor"))


@dataclass(frozen=True)
class Destination:
    """One buffer a device receives into (:meth:`WorkerProgram.destinations`).

    Attributes:
        tensor: the plan's tensor index: the key of ``Executor.run(..., out=)`` and of
            ``Handle.wait()``'s result.
        request: the request it belongs to: its index among the plan's inputs, the
            order the requests were given in.
        kind: ``"value"`` (the request's tensor, in its destination dtype) or
            ``"scales"`` (a scaled cast's scales, float32 or float8_e8m0fnu).
        shape: this device's shard of it.
        dtype: its dtype's name, as reshard, torch and ml_dtypes spell it
            (``"float8_e4m3fn"``, ``"bfloat16"``, ``"float32"``).
        box: the global box the shard holds.
    """

    tensor: int
    request: int
    kind: str
    shape: tuple[int, ...]
    dtype: str
    box: Box

    def empty(self, library: str = "numpy", device: Any = None) -> Any:
        """An uninitialised buffer for it: a numpy array (ml_dtypes' bfloat16 and
        float8), or with ``library="torch"`` a torch tensor in torch's own dtype on
        ``device`` (default: the CPU)."""
        if library == "torch":
            import torch

            return torch.empty(self.shape, dtype=getattr(torch, self.dtype), device=device)
        if library != "numpy":
            raise ValueError(f"library must be 'numpy' or 'torch', got {library!r}")
        return np.empty(self.shape, dtype=parse_dtype(self.dtype))


def destinations(tensors: Sequence[ProgramTensor]) -> tuple[Destination, ...]:
    """The buffers a device whose tensors are ``tensors`` receives into, by request,
    each request's value before its scales (an amax is the plan's own)."""
    inputs = [i for i, t in enumerate(tensors) if t.derive is Derive.NONE]
    request = {i: k for k, i in enumerate(inputs)}

    def owner(i: int) -> int:  # a scale's chain of links ends at its request's tensor
        while tensors[i].derive is not Derive.NONE:
            i = tensors[i].link
        return request[i]

    out = [Destination(i, owner(i), "value" if t.derive is Derive.NONE else "scales",
                       tuple(b - a for a, b in t.dst_box), t.out_dtype, t.dst_box)
           for i, t in enumerate(tensors)
           if t.dst_box is not None and t.derive is not Derive.AMAX]
    return tuple(sorted(out, key=lambda d: (d.request, d.kind != "value", d.tensor)))


@dataclass(frozen=True)
class WorkerProgram:
    """One device's part of a plan.

    Attributes:
        device: the device it runs on.
        tensors: every planned tensor, in plan order (indices match the plan's).
        tasks: this device's tasks as ``(index in the plan, task)``, in plan order.
        groups: the plan's collective member sets, in first-use order.
        strategy: the plan's strategy name (for messages).
        piece: bytes a relay passes on at a time, for backends that take a size
            (``Capabilities.sized_pieces``): the plan's ``Cluster.relay_piece``, which
            its model charges; 0: the backend's own.
    """

    device: int
    tensors: tuple[ProgramTensor, ...]
    tasks: tuple[tuple[int, Task], ...]
    groups: tuple[tuple[int, ...], ...]
    strategy: str = ""
    piece: int = 0

    @classmethod
    def of(cls, plan: ReshardPlan, device: int) -> WorkerProgram:
        """``device``'s program of ``plan`` (verified first; an empty program for a
        device outside the plan, which still names the plan's member sets). To cut many,
        :func:`programs` does all in one pass."""
        return programs(plan, (int(device),))[int(device)]

    def destinations(self) -> tuple[Destination, ...]:
        """The buffers this device receives into, by request (each request's value,
        then its scales): the shapes and dtypes of ``Executor.run``'s ``out``."""
        return destinations(self.tensors)

    def communicator_groups(self) -> tuple[tuple[int, ...], ...]:
        """The plan's collective member sets in first-use order (what a backend's
        ``prepare`` creates)."""
        return self.groups

    @property
    def num_tasks(self) -> int:
        """Tasks this device takes part in."""
        return len(self.tasks)

    def check(self) -> None:
        """What one device can check of its program (see the module docstring).

        Raises:
            PlanError: naming the task and the rule it breaks.
        """
        d = self.device
        if not isinstance(self.piece, int) or self.piece < 0:
            raise PlanError(f"device {d}'s program: piece must be an integer >= 0 bytes, "
                            f"got {self.piece!r}")
        for i, t in self.tasks:
            if d not in t.devices:
                raise PlanError(f"{_where(i, t, d)} does not involve device {d}; a program "
                                f"holds only its device's tasks (cut it with "
                                f"WorkerProgram.of)")
            if not 0 <= t.tensor < len(self.tensors):
                raise PlanError(f"{_where(i, t, d)} names tensor {t.tensor}, but the program "
                                f"has {len(self.tensors)} tensors")
            pt = self.tensors[t.tensor]
            for need, box in _shards_needed(t, d, pt):
                if box is None:
                    raise PlanError(f"{_where(i, t, d)} needs device {d}'s {need} shard, "
                                    f"which it does not hold")
                if len(box) != len(t.box) or any(
                        not s0 <= a <= b <= s1 for (a, b), (s0, s1) in zip(t.box, box)):
                    raise PlanError(f"{_where(i, t, d)}: box {t.box} is not inside device "
                                    f"{d}'s {need} shard {box}")
        for i, pt in enumerate(self.tensors):
            if (pt.scale is not ScaleMode.NONE or pt.derive is not Derive.NONE) and \
                    not 0 <= pt.link < len(self.tensors):
                raise PlanError(f"tensor {i} of device {d}'s program links tensor {pt.link}, "
                                f"but the program has {len(self.tensors)} tensors")
            for box in (pt.src_box, pt.dst_box):
                if box is not None and (len(box) != len(pt.shape) or any(
                        not 0 <= a <= b <= n for (a, b), n in zip(box, pt.shape))):
                    raise PlanError(f"tensor {i} of device {d}'s program: shard box {box} "
                                    f"lies outside shape {pt.shape}")

    # ----- serialisation ---------------------------------------------------------------
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled with its tasks as rows of field values, not as task objects (a
        launcher's transport pickles a program for each worker: a program of 1,024 tasks
        pickles 3.8x and unpickles 1.6x faster so, and is 15% smaller)."""
        rows = tuple((i, _TASK_FIELDS(t)) for i, t in self.tasks)
        return (_unpickled, (self.device, self.tensors, rows, self.groups, self.strategy,
                             self.piece))

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"format": PROGRAM_FORMAT, "device": self.device, "strategy": self.strategy,
                "piece": self.piece, "tensors": [t.to_dict() for t in self.tensors],
                "tasks": [[i, t.to_dict()] for i, t in self.tasks],
                "groups": [list(g) for g in self.groups]}

    def to_json(self) -> str:
        """Lossless JSON text."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: Any) -> WorkerProgram:
        """Inverse of :meth:`to_dict` (then :meth:`check`).

        Raises:
            PlanError: the form is malformed or fails :meth:`check`.
        """
        if not isinstance(d, dict) or d.get("format") != PROGRAM_FORMAT:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise PlanError(f"worker program format {got!r:.40} is not supported; this "
                            f"reshard reads format {PROGRAM_FORMAT}")
        try:
            prog = cls(int(d["device"]),
                       tuple(ProgramTensor.from_dict(t) for t in d["tensors"]),
                       tuple((int(i), Task.from_dict(t)) for i, t in d["tasks"]),
                       tuple(tuple(int(x) for x in g) for g in d["groups"]),
                       str(d.get("strategy", "")), int(d.get("piece", 0)))
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"malformed worker program: {type(e).__name__}: {e}") from e
        prog.check()
        return prog

    @classmethod
    def from_json(cls, text: str | bytes) -> WorkerProgram:
        """Inverse of :meth:`to_json`."""
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, TypeError, UnicodeDecodeError) as e:
            raise PlanError(f"worker program is not valid JSON: {e}") from None
        return cls.from_dict(d)


_TASK_FIELDS = operator.attrgetter(*(f.name for f in fields(Task)))
"""A task's field values, in the order :class:`Task` takes them."""


def _unpickled(device: int, tensors: tuple[ProgramTensor, ...],
               rows: tuple[tuple[int, tuple[Any, ...]], ...],
               groups: tuple[tuple[int, ...], ...], strategy: str,
               piece: int = 0) -> WorkerProgram:
    """Inverse of :meth:`WorkerProgram.__reduce__` (the receiver checks the program,
    as it checks any it did not cut itself)."""
    return WorkerProgram(device, tensors, tuple((i, Task(*row)) for i, row in rows),
                         groups, strategy, piece)


def programs(plan: ReshardPlan, devices: Iterable[int] | None = None, *,
             all_groups: bool = True, verify: bool = True) -> dict[int, WorkerProgram]:
    """The programs of ``devices`` (default: the plan's) of ``plan``, verified first, cut
    in one pass: O(tasks + devices x tensors) in all, each task landing in its devices'
    lists once.

    Args:
        plan: the plan.
        devices: whose programs (a device outside the plan gets an empty one).
        all_groups: every program names every collective member set of the plan (what
            backends whose communicators every rank of the world creates need, e.g.
            gloo's ``new_group``); False: only the sets its device is in.
        verify: verify the whole plan first; False checks only each program
            (:meth:`WorkerProgram.check`), for a plan this process just made itself (an
            SPMD rank, :mod:`reshard.comm.spmd`: the whole plan's verification costs
            about ten times the cut).

    Raises:
        PlanError: ``plan`` is not a ReshardPlan or fails verification.
    """
    if not isinstance(plan, ReshardPlan):
        raise PlanError(f"expected a ReshardPlan, got {type(plan).__name__}")
    if verify:
        plan.verify()
    wanted = tuple(dict.fromkeys(int(d) for d in (plan.devices if devices is None
                                                  else devices)))
    with paused():
        tasks = tasks_of(plan.tasks, wanted)
    everything = plan.communicator_groups()
    groups: dict[int, list[tuple[int, ...]]] = {d: [] for d in wanted}
    if not all_groups:
        for g in everything:
            for d in g:
                theirs = groups.get(d)
                if theirs is not None:
                    theirs.append(g)
    cut = _Cutter(plan.tensors, plan.strategy.value, plan.cluster.relay_piece)
    out = {}
    for d in wanted:
        out[d] = cut.program(d, tasks[d], everything if all_groups else tuple(groups[d]))
        if not verify:
            out[d].check()
    return out


def share_program(share: PlanShare, all_groups: bool = True) -> WorkerProgram:
    """The program of a device's share of a plan (:func:`reshard.planner.share.
    plan_share`, an SPMD rank's), checked (:meth:`WorkerProgram.check`).

    Args:
        share: the share.
        all_groups: the program names every collective member set of the plan (see
            :func:`programs`); False: only those its device is in.

    Raises:
        PlanError: the program fails its check.
    """
    d = share.device
    groups = share.groups if all_groups else tuple(g for g in share.groups if d in g)
    prog = _Cutter(share.tensors, share.strategy.value, share.cluster.relay_piece).program(
        d, share.tasks, groups)
    prog.check()
    return prog


class _Cutter:
    """Programs of one plan's devices, the layouts' boxes computed once per layout."""

    def __init__(self, tensors: Sequence[TensorSpec], strategy: str, piece: int) -> None:
        self.tensors = tensors
        self.strategy = strategy
        self.piece = piece
        self._layouts: dict[tuple, tuple[dict[int, Box], dict[int, Box], frozenset[int]]] = {}

    def _boxes(self, t: TensorSpec) -> tuple[dict[int, Box], dict[int, Box], frozenset[int]]:
        key = (t.shape, t.src, t.dst)
        got = self._layouts.get(key)
        if got is None:
            got = self._layouts[key] = (t.src.boxes(t.shape), t.dst.boxes(t.shape),
                                        frozenset(t.dst.partial_leaders()))
        return got

    def program(self, d: int, tasks: Sequence[tuple[int, Task]],
                groups: tuple[tuple[int, ...], ...]) -> WorkerProgram:
        """Device ``d``'s program of ``tasks`` (its own, with their plan indices)."""
        out = []
        for t in self.tensors:
            src_boxes, dst_boxes, leaders = self._boxes(t)
            dst = dst_boxes.get(d)
            out.append(ProgramTensor(t.shape, t.dtype, src_boxes.get(d), dst,
                                     dst is not None and d not in leaders, t.cast, t.scale,
                                     t.derive, t.link, t.fold))
        return WorkerProgram(d, tuple(out), tuple(tasks), groups, self.strategy, self.piece)


def _where(i: int, t: Task, d: int) -> str:
    """How a check's error names a task (formatted only on an error: a load checks
    every task of its program)."""
    return f"task #{i} ({t}) of device {d}'s program"


def _shards_needed(t: Task, d: int, pt: ProgramTensor) -> list[tuple[str, Box | None]]:
    """The shards device ``d`` reads or writes in task ``t``: ``(name, its box)``."""
    if t.kind is TaskKind.COPY:
        return [("source", pt.src_box), ("destination", pt.dst_box)]
    if t.kind is TaskKind.REDUCE or t.kind is TaskKind.ALLREDUCE:
        return [("source", pt.src_box)]
    if t.kind is TaskKind.ALLGATHER:
        return [("destination", pt.dst_box)]
    if t.root == d or d in t.addends:
        return [("source" if t.source is Buffer.SRC else "destination",
                 pt.src_box if t.source is Buffer.SRC else pt.dst_box)]
    if d in t.through:
        return []
    return [("destination", pt.dst_box)]


__all__ = ["PROGRAM_FORMAT", "Destination", "ProgramTensor", "WorkerProgram", "destinations",
           "programs", "share_program"]

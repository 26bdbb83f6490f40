"""The plan IR: tasks with global boxes, and the frozen plan with a lossless JSON form.

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
  down the chain ``addends[0] -> addends[1] -> ... -> root`` and passed on to the
  receivers as soon as the root added its own; ``source`` is ``src``.
* ``REDUCE``: ``root.src[box] = sum(d.src[box] for d in (root, *receivers))``; the root
  works on a private copy of its source shard, so the caller's data is untouched.
* ``ALLGATHER``: member ``receivers[i]`` holds ``pieces[i]`` in its ``dst``; afterwards
  every member holds every piece in its ``dst``.

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
import hashlib
import io
import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from reshard.cluster import Cluster
from reshard.dtypes import ReduceOp, ScaleMode, accumulator, itemsize, parse_dtype
from reshard.errors import PlanError
from reshard.layout import Box, Layout, box_size
from reshard.planner.gcpause import paused
from reshard.planner.strategy import Strategy

if TYPE_CHECKING:
    from reshard.planner.cost import Estimate

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


class Buffer(enum.Enum):
    """Which shard a task's root reads from."""

    SRC = "src"
    DST = "dst"

DIGEST_CHUNK = 1 << 16
"""Tasks hashed at a time by :meth:`ReshardPlan.digest`."""

_TASK_FIELDS = attrgetter("tensor", "box", "root", "receivers", "nbytes", "step", "pieces",
                          "through", "parents", "addends")
"""A task's fields but its two enums (which :func:`_digest_bytes` spells by value)."""


def _digest_bytes(tasks: Sequence[Task]) -> bytes:
    """The bytes :meth:`ReshardPlan.digest` hashes for ``tasks``: a pickle of their
    fields (ints and tuples of ints: the same bytes in every process, whatever its hash
    seed), the enums by value. Pickled without its memo (``fast``: nothing in it repeats
    by reference or refers to itself), which halves the cost of a million tasks."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5)
    pickler.fast = True
    pickler.dump(([t.kind._value_ for t in tasks], [t.source._value_ for t in tasks],
                  list(map(_TASK_FIELDS, tasks))))
    return out.getvalue()


@dataclass(frozen=True, slots=True)
class Task:
    """One step of a plan.

    Attributes:
        kind: the operation.
        tensor: index of the tensor in :attr:`ReshardPlan.tensors`.
        box: the global box moved (for ``ALLGATHER``, the union of the pieces).
        root: sending / reducing device; ``-1`` for ``ALLGATHER``.
        receivers: receiving devices (``REDUCE``: contributing devices; ``ALLGATHER``:
            members).
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

    def edges(self) -> tuple[tuple[int, int], ...]:
        """A ``SEND`` / ``BROADCAST`` as (sender, receiver) pairs in receiver order:
        the chain ``root -> receivers[0] -> ...``, or the tree of :attr:`parents`."""
        if self.parents:
            return tuple(zip(self.parents, self.receivers))
        return tuple(zip((self.root, *self.receivers), self.receivers))

    def parts(self) -> tuple[Task, Task]:
        """A broadcast with ``addends`` as what it fuses: the ``REDUCE`` of its box
        into the root, and the plain broadcast of the sum (for backends that run them
        one after the other)."""
        if not self.addends:
            raise PlanError(f"task ({self}) sums no addends; it has no parts")
        return (Task(TaskKind.REDUCE, self.tensor, self.box, self.root, self.addends,
                     self.nbytes, self.step),
                replace(self, addends=()))

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

    def to_dict(self) -> dict:
        """JSON-ready form."""
        d: dict[str, Any] = {
            "kind": self.kind.value, "tensor": self.tensor, "box": [list(b) for b in self.box],
            "root": self.root, "receivers": list(self.receivers), "nbytes": self.nbytes,
            "step": self.step, "source": self.source.value,
        }
        if self.pieces:
            d["pieces"] = [[list(b) for b in p] for p in self.pieces]
        if self.through:
            d["through"] = list(self.through)
        if self.parents:
            d["parents"] = list(self.parents)
        if self.addends:
            d["addends"] = list(self.addends)
        return d

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
        )

    def __str__(self) -> str:
        box = "x".join(f"{a}:{b}" for a, b in self.box)
        summed = f"sum{list(self.addends)}+" if self.addends else ""
        return (f"[{self.step}] {self.kind.value} t{self.tensor} [{box}] "
                f"{summed}{self.root}->{list(self.receivers)} {self.nbytes}B")


def _obj(raw: Any, what: str) -> dict:
    if not isinstance(raw, dict):
        raise PlanError(f"{what} must be a JSON object, got {type(raw).__name__}: {raw!r:.60}")
    return raw


def _get(d: dict, key: str, what: str) -> Any:
    if key not in d:
        raise PlanError(f"{what} has no field {key!r} (fields: {sorted(d)})")
    return d[key]


def _list(raw: Any, what: str) -> list:
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
        return d

    @staticmethod
    def conversion_of(d: dict, what: str = "tensor") -> tuple[str, ScaleMode, Derive, int]:
        """``(cast, scale, derive, link)`` of a JSON form (:meth:`conversion_dict`);
        strict about types."""
        cast = d.get("cast", "")
        if not isinstance(cast, str):
            raise PlanError(f"{what} cast must be a dtype name such as 'bfloat16', got "
                            f"{cast!r:.60}")
        return (cast, _enum(ScaleMode, d.get("scale", "none"), f"{what} scale"),
                _enum(Derive, d.get("derive", "none"), f"{what} derive"),
                _int(d.get("link", -1), f"{what} link"))

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
    """

    shape: tuple[int, ...]
    dtype: str
    src: Layout
    dst: Layout
    cast: str = ""
    scale: ScaleMode = ScaleMode.NONE
    derive: Derive = Derive.NONE
    link: int = -1

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor on the wire."""
        return box_size(tuple((0, s) for s in self.shape)) * self.itemsize

    def to_dict(self) -> dict:
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
            conv += f"/{self.scale.value}"
        if self.derive is not Derive.NONE:
            conv += f" ({self.derive.value} of t{self.link})"
        return f"{self.shape} {self.dtype}{conv} {self.src} -> {self.dst}"


def input_indices(tensors: Sequence[TensorSpec]) -> tuple[int, ...]:
    """Indices of a plan's tensors whose sources the caller gives (not derived)."""
    return tuple(i for i, t in enumerate(tensors) if t.derive is Derive.NONE)


def output_indices(tensors: Sequence[TensorSpec]) -> tuple[int, ...]:
    """Indices of a plan's tensors a caller receives: the inputs, then the scales of
    scaled casts (an amax is internal to the plan)."""
    return input_indices(tensors) + tuple(
        i for i, t in enumerate(tensors) if t.derive in (Derive.SCALES, Derive.OWN_SCALES))


@dataclass(frozen=True)
class ReshardPlan:
    """A frozen, serializable resharding plan for one or more tensors.

    Attributes:
        tensors: the planned tensors.
        tasks: the tasks in the global order every worker follows.
        strategy: the strategy that produced the plan.
        cluster: the cluster the plan was balanced for and is costed on.
    """

    tensors: tuple[TensorSpec, ...]
    tasks: tuple[Task, ...]
    strategy: Strategy
    cluster: Cluster
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __hash__(self) -> int:
        """Hashed once (a plan keys the Runtime's caches on every call; its tasks are
        many)."""
        got = self._cache.get("hash")
        if got is None:
            got = self._cache["hash"] = hash((self.tensors, self.tasks, self.strategy,
                                              self.cluster))
        return got  # type: ignore[no-any-return]

    # ----- single-tensor conveniences ----------------------------------------------------
    def _only(self) -> TensorSpec:
        inputs = self.inputs
        if len(inputs) != 1:
            raise PlanError(
                f"this plan moves {len(inputs)} tensors; use plan.tensors[i] instead"
            )
        return self.tensors[inputs[0]]

    @cached_property
    def inputs(self) -> tuple[int, ...]:
        """Indices of the tensors whose sources the caller gives (not derived), in
        order: a plan's requests. The others (a scaled cast's amax and scales) follow
        them."""
        return input_indices(self.tensors)

    @cached_property
    def outputs(self) -> tuple[int, ...]:
        """Indices of the tensors a caller receives: the inputs, then the scales of
        scaled casts (an amax is internal to the plan)."""
        return output_indices(self.tensors)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the (only) tensor."""
        return self._only().shape

    @property
    def dtype(self) -> np.dtype:
        """dtype of the (only) tensor."""
        return parse_dtype(self._only().dtype)

    @property
    def src(self) -> Layout:
        """Source layout of the (only) tensor."""
        return self._only().src

    @property
    def dst(self) -> Layout:
        """Destination layout of the (only) tensor."""
        return self._only().dst

    # ----- queries -------------------------------------------------------------------------
    @cached_property
    def devices(self) -> tuple[int, ...]:
        """Every device holding a source or destination shard or relaying a task,
        sorted."""
        devs: set[int] = set()
        for t in self.tensors:
            devs.update(t.src.devices)
            devs.update(t.dst.devices)
        for task in self.tasks:
            devs.update(task.through)
        return tuple(sorted(devs))


    @property
    def num_steps(self) -> int:
        """Rounds of the global order."""
        return 1 + max((t.step for t in self.tasks), default=-1)

    def bytes_moved(self) -> int:
        """Bytes that leave a device (copies excluded)."""
        return sum(t.nbytes for t in self.tasks if t.kind is not TaskKind.COPY)

    def communicator_groups(self) -> tuple[tuple[int, ...], ...]:
        """Distinct member sets of the collectives, in first-use order (a broadcast
        summing addends counts as its :meth:`Task.parts`, which a backend that runs them
        apart makes communicators for)."""
        got = self._cache.get("groups")
        if got is None:
            seen: dict[tuple[int, ...], None] = {}
            collective = (TaskKind.BROADCAST, TaskKind.REDUCE, TaskKind.ALLGATHER)
            for t in self.tasks:
                if t.addends:
                    for part in t.parts():
                        seen.setdefault(part.group, None)
                elif t.kind in collective:
                    seen.setdefault(t.group, None)
            got = self._cache["groups"] = tuple(seen)
        return got  # type: ignore[no-any-return]

    # ----- cost ----------------------------------------------------------------------------
    def simulate(self) -> Estimate:
        """The cost model's detailed prediction (cached)."""
        est = self._cache.get("estimate")
        if est is None:
            from reshard.planner.cost import simulate

            est = simulate(self)
            self._cache["estimate"] = est
        return est

    def estimate(self) -> float:
        """Predicted seconds to run the plan on :attr:`cluster`."""
        return self.simulate().time

    def lower_bound(self) -> float:
        """Seconds no plan can beat on :attr:`cluster` (see :mod:`reshard.planner.cost`)."""
        lb = self._cache.get("lower_bound")
        if lb is None:
            from reshard.planner.cost import lower_bound

            lb = lower_bound(self.tensors, self.cluster)
            self._cache["lower_bound"] = lb
        return lb

    # ----- serialization -------------------------------------------------------------------
    def digest(self) -> bytes:
        """The SHA-256 of the plan's content (format, strategy, cluster, tensors and
        every task field, in order): equal for equal plans in any process, whatever its
        hash seed (cached). Ranks that each plan for themselves compare it
        (:mod:`reshard.comm.spmd`) before any byte moves."""
        got = self._cache.get("digest")
        if got is None:
            h = hashlib.sha256()
            h.update(json.dumps(self.to_dict_header(), sort_keys=True).encode())
            tasks = self.tasks
            with paused():
                for k in range(0, len(tasks), DIGEST_CHUNK):
                    h.update(_digest_bytes(tasks[k:k + DIGEST_CHUNK]))
            got = self._cache["digest"] = h.digest()
        return got  # type: ignore[no-any-return]

    def to_dict_header(self) -> dict:
        """:meth:`to_dict` without the tasks."""
        return {"format": FORMAT_VERSION, "strategy": self.strategy.value,
                "cluster": self.cluster.to_dict(), "tensors": [t.to_dict() for t in self.tensors]}

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {**self.to_dict_header(), "tasks": [t.to_dict() for t in self.tasks]}

    def to_json(self, indent: int | None = None) -> str:
        """Lossless JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Any, verify: bool = True) -> ReshardPlan:
        """Inverse of :meth:`to_dict`.

        Args:
            d: the JSON-ready form.
            verify: check the plan (:meth:`verify`) before returning it; pass False only
                for a plan a verifying party already checked (a driver's own workers).

        Raises:
            PlanError: the form is malformed or the plan breaks a rule of
                :mod:`reshard.planner.verify`; the message names the task and the rule.
        """
        d = _obj(d, "plan")
        if d.get("format") not in READABLE_FORMATS:
            raise PlanError(
                f"plan format {d.get('format')!r:.40} is not supported; this reshard reads "
                f"formats {list(READABLE_FORMATS)}"
            )
        try:
            tensors = tuple(TensorSpec.from_dict(t)
                            for t in _list(_get(d, "tensors", "plan"), "plan tensors"))
            tasks = []
            for i, t in enumerate(_list(_get(d, "tasks", "plan"), "plan tasks")):
                try:
                    tasks.append(Task.from_dict(t))
                except PlanError as e:
                    raise PlanError(f"task #{i}: {e}") from None
            plan = cls(tensors, tuple(tasks), Strategy.parse(_get(d, "strategy", "plan")),
                       Cluster.from_dict(_obj(_get(d, "cluster", "plan"), "plan cluster")))
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PlanError(f"malformed plan: {type(e).__name__}: {e}") from e
        if verify:
            plan.verify()
        return plan

    @classmethod
    def from_json(cls, text: str | bytes, verify: bool = True) -> ReshardPlan:
        """Inverse of :meth:`to_json` (``verify``: see :meth:`from_dict`)."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"plan is not valid JSON: {e}") from e
        except RecursionError:
            raise PlanError("plan JSON nests too deeply to be a plan") from None
        except (TypeError, UnicodeDecodeError) as e:
            raise PlanError(f"plan must be JSON text, got {type(text).__name__}: {e}") from None
        return cls.from_dict(d, verify=verify)

    def verify(self) -> None:
        """Check the plan before any byte moves (cached once it passed): types, ranges,
        every destination element delivered exactly once from a device that holds it.

        Raises:
            PlanError: naming the first task that breaks a rule and the rule.
        """
        if not self._cache.get("verified"):
            from reshard.planner.verify import verify_plan

            verify_plan(self)
            self._cache["verified"] = True

    def summary(self) -> str:
        """A few lines describing the plan."""
        kinds: dict[str, int] = {}
        for t in self.tasks:
            kinds[t.kind.value] = kinds.get(t.kind.value, 0) + 1
        head = ", ".join(str(t) for t in self.tensors[:3])
        more = f" (+{len(self.tensors) - 3} more)" if len(self.tensors) > 3 else ""
        return (f"ReshardPlan[{self.strategy.value}] {head}{more}: {len(self.tasks)} tasks "
                f"{kinds}, {self.num_steps} steps, {self.bytes_moved()} bytes moved, "
                f"estimate {self.estimate():.6g}s, lower bound {self.lower_bound():.6g}s")

    def __str__(self) -> str:
        return "\n".join([self.summary(), *(str(t) for t in self.tasks)])

"""What a stage search reads and returns: layers with their candidates per submesh
shape, the submeshes of a cluster, and the chosen stages with their times.

A *submesh shape* is ``(hosts, devices)``: ``(1, g)`` is ``g`` devices of one host,
``(h, G)`` is ``h`` whole hosts of ``G`` devices (Alpa's submeshes). A stage runs a run
of consecutive layers on one submesh; the stages take the cluster's devices in order,
every device used once. A *candidate* is one way to run a layer on a submesh of one
shape (a parallel layout, as a compiler enumerates them): its compute time per
microbatch (forward and backward), the layout it takes its input activation in and
gives its output in (:class:`reshard.ShardingSpec` text on the 2-d submesh), and the
bytes it holds per device.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from reshard.cluster import Cluster
from reshard.dtypes import parse_dtype
from reshard.errors import ReshardBaseError, SearchError
from reshard.layout import Layout
from reshard.mesh import DeviceMesh
from reshard.search.checks import fits_submesh, integer, real, shape_key, spec_rank

_T = TypeVar("_T")

Shape = tuple[int, int]
"""A submesh shape: ``(hosts, devices per host)``."""


@dataclass(frozen=True)
class Candidate:
    """One way to run a layer on a submesh of one shape.

    Attributes:
        name: what the compiler calls it (e.g. ``"tp"``, ``"dp"``).
        compute: seconds per microbatch on the submesh, forward plus backward (the
            layer's own intra-op collectives included, as the compiler prices them).
        input: the layout of the layer's input activation (``ShardingSpec`` text on
            the submesh, e.g. ``"S0R"``: batch split over the submesh's hosts).
        output: the layout of its output activation.
        memory: bytes it holds on each device whatever the schedule (weights,
            gradients, optimizer state, working buffers; before ``activations`` was a
            field, also the activations it keeps).
        grads: bytes of weight gradients each device holds, all-reduced across
            data-parallel replicas of the pipeline once per iteration
            (:mod:`reshard.search.replicas`); 0: none.
        activations: bytes it keeps on each device per microbatch in flight (from its
            forward to the end of its backward); the schedule decides how many
            microbatches a stage holds at once (:mod:`reshard.search.memory`); 0: none.
    """

    name: str
    compute: float
    input: str
    output: str
    memory: int = 0
    grads: int = 0
    activations: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SearchError(f"a candidate's name must be a non-empty string, got "
                              f"{self.name!r}")
        object.__setattr__(self, "compute",
                           real(self.compute, f"candidate {self.name!r}: compute (seconds)"))
        object.__setattr__(self, "memory",
                           integer(self.memory, f"candidate {self.name!r}: memory (bytes)", 0))
        object.__setattr__(self, "grads",
                           integer(self.grads, f"candidate {self.name!r}: grads (bytes)", 0))
        object.__setattr__(self, "activations", integer(
            self.activations, f"candidate {self.name!r}: activations (bytes per microbatch)",
            0))
        for what in ("input", "output"):
            spec_rank(getattr(self, what), f"candidate {self.name!r}: its {what} layout")


@dataclass(frozen=True)
class Layer:
    """One layer of a chain.

    Attributes:
        name: for messages and results.
        output_shape: the shape of its output activation per microbatch (the next
            layer's input; its gradient moves back with the same shape).
        dtype: the activation's dtype.
        candidates: its candidates per submesh shape (a shape it has none for cannot
            hold it).
    """

    name: str
    output_shape: tuple[int, ...]
    dtype: str
    candidates: Mapping[Shape, tuple[Candidate, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise SearchError(f"a layer's name must be a string, got {self.name!r}")
        shape = self.output_shape
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
            raise SearchError(f"layer {self.name!r}: output_shape must be a tuple of "
                              f"integers, got {shape!r}")
        object.__setattr__(self, "output_shape", tuple(
            integer(n, f"layer {self.name!r}: output_shape's dim {i}", 0)
            for i, n in enumerate(shape)))
        try:
            parse_dtype(self.dtype)
        except ReshardBaseError as e:
            raise SearchError(f"layer {self.name!r}: {e}") from None
        object.__setattr__(self, "candidates", _candidate_map(self.name, self.candidates))
        rank = len(self.output_shape)
        seen: dict[tuple[str, Shape], None] = {}
        for sub, cands in self.candidates.items():
            for c in cands:
                where = f"layer {self.name!r} candidate {c.name!r} on {sub}"
                fits_submesh(c.input, sub, f"{where}: its input layout", seen)
                fits_submesh(c.output, sub, f"{where}: its output layout", seen)
                if rank and spec_rank(c.output, where) != rank:
                    raise SearchError(
                        f"{where} gives its output as {c.output!r} (rank "
                        f"{spec_rank(c.output, where)}), but the layer's output_shape "
                        f"{self.output_shape} has rank {rank}")


def checked_already(cls: type[_T], **fields: object) -> _T:
    """A ``Candidate`` or ``Layer`` built from parts the search checked already (a
    block of checked layers, a checked candidate with its compute grown), without
    checking them again: a search at scale builds tens of thousands."""
    out = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(out, name, value)
    return out


def _candidate_map(name: str, value: object) -> dict[Shape, tuple[Candidate, ...]]:
    """A layer's candidates as ``{shape: (Candidate, ...)}``, each shape's names
    distinct (a SearchError naming the layer, the shape and the name)."""
    if not isinstance(value, Mapping):
        raise SearchError(f"layer {name!r}: candidates must map a submesh shape to a tuple "
                          f"of Candidate, got {type(value).__name__}")
    out: dict[Shape, tuple[Candidate, ...]] = {}
    for key, cands in value.items():
        shape = shape_key(key, f"layer {name!r}")
        if isinstance(cands, (Candidate, str)) or not isinstance(cands, Sequence):
            raise SearchError(f"layer {name!r} on {shape}: candidates must be a tuple of "
                              f"Candidate, got {cands!r:.120}")
        names: set[str] = set()
        for c in cands:
            if not isinstance(c, Candidate):
                raise SearchError(f"layer {name!r} on {shape}: a candidate must be a "
                                  f"Candidate, got {c!r:.120}")
            if c.name in names:
                raise SearchError(f"layer {name!r} has two candidates named {c.name!r} on "
                                  f"{shape}: a choice names its candidates, so give each "
                                  f"a name of its own")
            names.add(c.name)
        out[shape] = tuple(cands)
    return out


@dataclass(frozen=True)
class Placement:
    """A submesh of a cluster: its shape and its first device (devices in order)."""

    shape: Shape
    first: int

    @property
    def size(self) -> int:
        """Its number of devices."""
        return self.shape[0] * self.shape[1]

    def mesh(self) -> DeviceMesh:
        """The 2-d mesh of its devices, host-major."""
        return DeviceMesh(self.shape, range(self.first, self.first + self.size))

    def layout(self, spec: str) -> Layout:
        """A layout on this submesh."""
        return Layout(self.mesh(), spec)


def devices(cluster: Cluster) -> int:
    """A regular cluster's device count (without listing its devices)."""
    return cluster.num_hosts * len(cluster.hosts[0])


def placements(cluster: Cluster, shape: Shape, first: int) -> Placement | None:
    """The submesh of ``shape`` starting at device ``first`` of a regular ``cluster``, or
    None where none fits there: ``(1, g)`` inside one host, ``(h, G)`` on whole hosts."""
    hosts, per = shape
    g = len(cluster.hosts[0])
    if hosts < 1 or per < 1 or first + hosts * per > g * cluster.num_hosts:
        return None
    if hosts == 1 and first % g + per <= g:
        return Placement(shape, first)
    if hosts > 1 and per == g and first % g == 0:
        return Placement(shape, first)
    return None


@dataclass(frozen=True)
class Stage:
    """One chosen stage.

    Attributes:
        first: its first layer (index).
        last: its last layer (index, inclusive).
        placement: its submesh.
        choices: the chosen candidate's name per layer.
        compute: its layers' compute per microbatch.
        inner: its moves between layers of the stage, per microbatch (both ways).
        move_in: the move of its input activation from the stage before, and of its
            gradient back, per microbatch (0 for the first stage).
    """

    first: int
    last: int
    placement: Placement
    choices: tuple[str, ...]
    compute: float
    inner: float
    move_in: float


@dataclass(frozen=True)
class Choice:
    """A search's answer.

    Attributes:
        stages: the stages, in pipeline order.
        microbatches: B.
        schedule: the schedule the objective models
            (:class:`reshard.search.kinds.SearchSchedule`; equal to its name).
        time: the objective's iteration time (seconds).
        compute: of it, the bottleneck stage's compute over all microbatches.
        transfer: of it, the bottleneck stage's exposed moves over all microbatches.
        bubble: the rest (pipeline fill and drain).
        simulated: the pipeline simulator's iteration time of it, where it was asked
            (:func:`reshard.search.rerank`); None otherwise.
        chunks: stages per submesh (virtual stages: ``stages`` are the pieces in
            pipeline order, ``len(stages) / chunks`` submeshes each holding ``chunks``
            of them as the schedule places them); 1: a stage per submesh.
    """

    stages: tuple[Stage, ...]
    microbatches: int
    schedule: str
    time: float
    compute: float
    transfer: float
    bubble: float
    simulated: float | None = None
    chunks: int = 1


@dataclass(frozen=True)
class Budget:
    """A search's time budget: at most ``seconds`` from ``start`` (None: no limit).

    Every phase of a search (building block and stage options, pricing moves, each
    bound of the DP, re-ranking, a graph's descent) checks it often enough that the
    search stops within a fraction of a second of its deadline: a check costs one
    clock read, and its message is written only when it fails.
    """

    seconds: float | None
    start: float = field(default_factory=time.monotonic)

    @classmethod
    def of(cls, value: object) -> Budget:
        """``value`` as a budget starting now (a budget: itself; None: no limit)."""
        if isinstance(value, Budget):
            return value
        if value is None:
            return cls(None)
        return cls(real(value, "time_limit (seconds; None: no limit)", positive=True))

    @property
    def end(self) -> float:
        """The deadline on :func:`time.monotonic`'s clock (inf: none)."""
        return math.inf if self.seconds is None else self.start + self.seconds

    def left(self) -> float:
        """Seconds until the deadline (inf: none)."""
        return self.end - time.monotonic()

    def check(self, where: str, *args: object) -> None:
        """A SearchError naming ``where`` (formatted with ``args``, ``str.format``'s
        way, only then) once the budget is spent."""
        if self.seconds is not None and time.monotonic() > self.start + self.seconds:
            late = time.monotonic() - self.start - self.seconds
            raise SearchError(f"the search ran past its time_limit of {self.seconds:g} s "
                              f"(by {late:.3f} s) {where.format(*args)}; give a larger "
                              f"time_limit, fewer candidates or larger blocks")


def check_cluster(cluster: Cluster) -> None:
    """A search cuts submeshes from hosts of one size whose devices are numbered host
    by host from 0 (:meth:`reshard.Cluster.regular`, the presets)."""
    g = len(cluster.hosts[0])
    want = tuple(tuple(range(h * g, (h + 1) * g)) for h in range(cluster.num_hosts))
    if tuple(tuple(h) for h in cluster.hosts) != want:
        raise SearchError(
            f"the search cuts submeshes from hosts of one size numbered host by host from "
            f"0 (Cluster.regular or a preset); cluster {cluster.name!r} has hosts "
            f"{[len(h) for h in cluster.hosts]} devices")


__all__ = ["Budget", "Candidate", "Choice", "Layer", "Placement", "Shape", "Stage", "check_cluster", "checked_already", "devices",
           "placements"]

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
from collections.abc import Mapping
from dataclasses import dataclass, field

from reshard.cluster import Cluster
from reshard.errors import SearchError
from reshard.layout import Layout
from reshard.mesh import DeviceMesh

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
        memory: bytes it holds on each device (weights, optimizer state and the
            activations it keeps).
    """

    name: str
    compute: float
    input: str
    output: str
    memory: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.compute, (int, float)) and math.isfinite(self.compute)
                and self.compute >= 0):
            raise SearchError(f"candidate {self.name!r}: compute must be finite seconds "
                              f">= 0, got {self.compute!r}")
        if isinstance(self.memory, bool) or not isinstance(self.memory, int) or \
                self.memory < 0:
            raise SearchError(f"candidate {self.name!r}: memory must be bytes >= 0, got "
                              f"{self.memory!r}")


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


def placements(cluster: Cluster, shape: Shape, first: int) -> Placement | None:
    """The submesh of ``shape`` starting at device ``first`` of a regular ``cluster``, or
    None where none fits there: ``(1, g)`` inside one host, ``(h, G)`` on whole hosts."""
    hosts, per = shape
    g = len(cluster.hosts[0])
    if hosts < 1 or per < 1 or first + hosts * per > len(cluster.devices):
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
        schedule: the schedule the objective models (:data:`SCHEDULES`).
        time: the objective's iteration time (seconds).
        compute: of it, the bottleneck stage's compute over all microbatches.
        transfer: of it, the bottleneck stage's exposed moves over all microbatches.
        bubble: the rest (pipeline fill and drain).
        simulated: the pipeline simulator's iteration time of it, where it was asked
            (:func:`reshard.search.rerank`); None otherwise.
    """

    stages: tuple[Stage, ...]
    microbatches: int
    schedule: str
    time: float
    compute: float
    transfer: float
    bubble: float
    simulated: float | None = None


@dataclass(frozen=True)
class Budget:
    """A search's time budget: at most ``seconds`` from ``start`` (None: no limit)."""

    seconds: float | None
    start: float = field(default_factory=time.monotonic)

    @classmethod
    def of(cls, value: float | Budget | None) -> Budget:
        """``value`` as a budget starting now (a budget: itself)."""
        if isinstance(value, Budget):
            return value
        if value is not None and (isinstance(value, bool) or
                                  not isinstance(value, (int, float)) or
                                  not math.isfinite(value) or value <= 0):
            raise SearchError(f"time_limit must be seconds > 0 or None, got {value!r}")
        return cls(None if value is None else float(value))

    def check(self, where: str) -> None:
        """A SearchError naming ``where`` once the budget is spent."""
        if self.seconds is not None and time.monotonic() - self.start > self.seconds:
            raise SearchError(f"the search ran past its time_limit of {self.seconds:g} s "
                              f"{where}; give a larger time_limit, fewer candidates or "
                              f"larger blocks")


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


__all__ = ["Budget", "Candidate", "Choice", "Layer", "Placement", "Shape", "Stage", "check_cluster",
           "placements"]

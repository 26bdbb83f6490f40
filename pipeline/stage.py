"""What a pipeline stage computes and how its data is laid out.

A :class:`StageSpec` places one (virtual) stage on a device mesh: the layouts of its
input activation, output activation and input gradient (which may be a partial sum,
e.g. after a column-parallel layer), its parameters with their layouts, and the class
that computes on local shards. The class is named by import path so that worker
processes can build it; it implements :class:`StageModule`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from reshard.core.layout import Layout
from reshard.core.mesh import DeviceMesh
from reshard.pipeline.errors import ScheduleError


class StageModule(Protocol):
    """Computation of one stage on one device's local shards.

    ``saved`` is whatever :meth:`forward` keeps for the backward of the same
    microbatch. The split backward (``backward_input`` then ``backward_weight``) serves
    zero-bubble schedules; :meth:`backward` must equal the two in sequence.
    """

    def forward(self, params: Mapping[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, Any]:
        """Output activation shard and saved state."""

    def backward_input(self, params: Mapping[str, np.ndarray], saved: Any,
                       dy: np.ndarray) -> tuple[np.ndarray, Any]:
        """Gradient shard w.r.t. the input (layout ``dx_spec``) and state for the weight
        gradient."""

    def backward_weight(self, params: Mapping[str, np.ndarray], saved: Any) -> dict[str, np.ndarray]:
        """Gradient shards of the parameters (layouts ``ParamSpec.grad_spec``)."""

    def loss(self, y: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
        """Last stage only: this shard's part of the loss, and dloss/dy for the shard."""


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: global shape, its layout on the stage mesh, and the layout of the
    gradient each device accumulates (a partial sum for data-parallel copies)."""

    name: str
    shape: tuple[int, ...]
    spec: str
    grad_spec: str


@dataclass(frozen=True)
class StageSpec:
    """One virtual stage of a pipeline.

    Attributes:
        mesh: the stage's devices.
        module: ``"package.module:Class"`` implementing :class:`StageModule`.
        options: keyword arguments for the class, as sorted ``(name, value)`` pairs.
        in_shape: global shape of one microbatch's input activation.
        out_shape: global shape of one microbatch's output activation.
        in_spec: layout of the input activation on ``mesh``.
        out_spec: layout of the output activation.
        dx_spec: layout of the input gradient the stage produces.
        params: the stage's parameters.
    """

    mesh: DeviceMesh
    module: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    in_spec: str
    out_spec: str
    dx_spec: str
    params: tuple[ParamSpec, ...] = ()
    options: tuple[tuple[str, Any], ...] = field(default=())

    def layout(self, spec: str) -> Layout:
        """``spec`` on this stage's mesh."""
        return Layout(self.mesh, spec)

    def build(self) -> StageModule:
        """Import and construct the module (in the worker process)."""
        path, _, name = self.module.partition(":")
        try:
            cls = getattr(importlib.import_module(path), name)
        except (ImportError, AttributeError) as e:
            raise ScheduleError(
                f"stage module {self.module!r} cannot be imported ({e}); give "
                f"'package.module:Class' importable in the worker processes") from None
        return cls(**dict(self.options))

"""Compute and transfer times that the pipeline simulator charges for each action.

Compute costs are indexed by virtual stage (``chunk * num_stages + stage``; the stage
itself when there is one chunk per stage). Transfer costs are indexed by boundary:
boundary ``b`` joins virtual stages ``b`` and ``b + 1``, so with one chunk per stage
boundary ``s`` is the link between stage ``s`` and ``s + 1``; activations cross it
downstream, gradients upstream.

Each cost is given as one of:

* a number: the same time everywhere;
* a sequence: one time per index;
* a callable ``f(index) -> float``.

Transfer times can come from reshard plans: :func:`plan_times` calls ``estimate()`` on
each plan (any object with that method, such as the planner's ``ReshardPlan``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, runtime_checkable

from reshard.pipeline.actions import ActionKind
from reshard.pipeline.errors import ScheduleError

CostSpec: TypeAlias = float | Sequence[float] | Callable[[int], float]
"""A time in seconds (or any consistent unit): a number, a per-index sequence, or a callable."""


@runtime_checkable
class SupportsEstimate(Protocol):
    """Anything with an ``estimate()`` method returning seconds, e.g. a reshard plan."""

    def estimate(self) -> float:
        """Predicted time of the transfer in seconds."""
        ...


def plan_times(plans: Sequence[SupportsEstimate], **estimate_options: Any) -> tuple[float, ...]:
    """Transfer times of a sequence of plans, one per boundary.

    Args:
        plans: ``plans[b]`` moves the tensor across boundary ``b``; each needs an
            ``estimate(**estimate_options)`` method returning seconds.
        **estimate_options: Passed to every ``estimate`` call (e.g. a cluster).

    Returns:
        The estimated times, in boundary order.

    Raises:
        ScheduleError: A plan has no ``estimate`` method or returns something that is
            not a non-negative number.
    """
    times = []
    for b, plan in enumerate(plans):
        estimate = getattr(plan, "estimate", None)
        if not callable(estimate):
            raise ScheduleError(
                f"transfer plan for boundary {b} has no estimate() method: {plan!r}"
            )
        times.append(_check_time(estimate(**estimate_options), f"plan {b} estimate()"))
    return tuple(times)


@dataclass(frozen=True)
class PipelineCosts:
    """Per-action times for :func:`reshard.pipeline.simulate`.

    Attributes:
        forward: Time of F, per virtual stage.
        backward: Time of a full backward B, per virtual stage.
        backward_input: Time of I (input grad); defaults to half of ``backward``.
        backward_weight: Time of W (weight grad); defaults to ``backward`` minus the
            time of I.
        activation_transfer: Time to move an activation across a boundary.
        gradient_transfer: Time to move a gradient across a boundary; defaults to
            ``activation_transfer`` (a gradient has its activation's shape).
        shared_nic: a stage's sends share one outbound link, in the order they are
            issued (its host's NIC), instead of one link per channel: on a V schedule
            a stage sends down and up at once (default False: one link per channel).
    """

    forward: CostSpec = 1.0
    backward: CostSpec = 2.0
    backward_input: CostSpec | None = None
    backward_weight: CostSpec | None = None
    activation_transfer: CostSpec = 0.0
    gradient_transfer: CostSpec | None = None
    shared_nic: bool = False

    def __post_init__(self) -> None:
        for name in (
            "forward",
            "backward",
            "backward_input",
            "backward_weight",
            "activation_transfer",
            "gradient_transfer",
        ):
            value = getattr(self, name)
            if value is None or callable(value):
                continue
            if isinstance(value, Sequence) and not isinstance(value, str | bytes):
                object.__setattr__(
                    self, name, tuple(_check_time(v, f"{name}[{i}]") for i, v in enumerate(value))
                )
            else:
                object.__setattr__(self, name, _check_time(value, name))

    @classmethod
    def from_plans(
        cls,
        activation_plans: Sequence[SupportsEstimate],
        gradient_plans: Sequence[SupportsEstimate] | None = None,
        *,
        forward: CostSpec = 1.0,
        backward: CostSpec = 2.0,
        backward_input: CostSpec | None = None,
        backward_weight: CostSpec | None = None,
        **estimate_options: Any,
    ) -> PipelineCosts:
        """Costs whose transfer times are the estimates of reshard plans.

        Args:
            activation_plans: Per boundary, the plan that moves the activation.
            gradient_plans: Per boundary, the plan that moves the gradient back;
                defaults to the activation times.
            forward: See the class attributes.
            backward: See the class attributes.
            backward_input: See the class attributes.
            backward_weight: See the class attributes.
            **estimate_options: Passed to every plan's ``estimate``.

        Returns:
            The costs.
        """
        activation = plan_times(activation_plans, **estimate_options)
        gradient = (
            None if gradient_plans is None else plan_times(gradient_plans, **estimate_options)
        )
        return cls(
            forward=forward,
            backward=backward,
            backward_input=backward_input,
            backward_weight=backward_weight,
            activation_transfer=activation,
            gradient_transfer=gradient,
        )

    def compute_time(self, kind: ActionKind, virtual_stage: int) -> float:
        """Time of a compute action (F, B, I or W) on a virtual stage."""
        if kind is ActionKind.FORWARD:
            return _lookup(self.forward, virtual_stage, "forward")
        if kind is ActionKind.BACKWARD:
            return _lookup(self.backward, virtual_stage, "backward")
        if kind is ActionKind.BACKWARD_INPUT:
            return self._input_time(virtual_stage)
        if kind is ActionKind.BACKWARD_WEIGHT:
            if self.backward_weight is not None:
                return _lookup(self.backward_weight, virtual_stage, "backward_weight")
            whole = _lookup(self.backward, virtual_stage, "backward")
            first = self._input_time(virtual_stage)
            if first > whole:
                raise ScheduleError(
                    f"backward_input ({first}) exceeds backward ({whole}) at virtual stage "
                    f"{virtual_stage}; give backward_weight explicitly"
                )
            return whole - first
        raise ScheduleError(f"{kind.value} is not a compute action; expected F, B, I or W")

    def transfer_time(self, send_kind: ActionKind, boundary: int) -> float:
        """Time to move data across a boundary (SEND_ACT: activation, SEND_GRAD: gradient)."""
        if send_kind is ActionKind.SEND_ACT or self.gradient_transfer is None:
            return _lookup(self.activation_transfer, boundary, "activation_transfer")
        if send_kind is ActionKind.SEND_GRAD:
            return _lookup(self.gradient_transfer, boundary, "gradient_transfer")
        raise ScheduleError(f"{send_kind.value} is not a send; expected SA or SG")

    def _input_time(self, virtual_stage: int) -> float:
        if self.backward_input is not None:
            return _lookup(self.backward_input, virtual_stage, "backward_input")
        return _lookup(self.backward, virtual_stage, "backward") / 2


def _lookup(spec: CostSpec, index: int, name: str) -> float:
    if isinstance(spec, tuple):
        if not 0 <= index < len(spec):
            raise ScheduleError(
                f"{name} gives {len(spec)} values but index {index} is needed; give one "
                "per virtual stage (compute) or per boundary (transfer)"
            )
        return spec[index]
    if callable(spec):
        return _check_time(spec(index), f"{name}({index})")
    return float(spec)  # type: ignore[arg-type]


def _check_time(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ScheduleError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ScheduleError(f"{name} must be finite and >= 0, got {value!r}")
    return float(value)

"""Errors raised by reshard.

Every error is a :class:`ReshardError`, itself a :class:`ValueError`, so callers can
catch one type. Messages state the rule that was broken, the bad value, and what
would be valid.
"""

from __future__ import annotations


class ReshardError(ValueError):
    """Base class of every error reshard raises on bad input or failed execution."""


class MeshError(ReshardError):
    """A device mesh is malformed (bad shape, duplicate or missing devices)."""


class SpecError(ReshardError):
    """A sharding spec is malformed or does not fit a mesh or tensor rank."""


class ShapeError(ReshardError):
    """A tensor shape is invalid or does not match a layout or array."""


class DTypeError(ReshardError):
    """A dtype is unknown or not supported for the requested operation."""


class ClusterError(ReshardError):
    """A cluster description is malformed or does not contain a device."""


class OptionError(ReshardError):
    """An unknown option name (a backend, a launcher, a mode) or options that do not go
    together; the message lists the valid choices."""


class StrategyError(OptionError):
    """An unknown strategy name."""


class PartialError(ReshardError):
    """A partial-sum layout that cannot be produced or reduced."""


class PlanError(ReshardError):
    """A plan is inconsistent or cannot be deserialized."""


class ExecutionError(ReshardError):
    """Executing a plan failed: a worker died, timed out, or a backend raised."""


class MissingDependencyError(ReshardError, ImportError):
    """An optional dependency a feature needs is not installed (the message names the
    extra to install)."""

"""Errors raised by reshard, in two categories that one base class joins.

* :class:`ReshardError` (a :class:`ValueError`) and its subclasses: the caller's input
  is wrong (a mesh, a spec, a shape, a dtype, a plan, an option); nothing ran. Messages
  state the rule that was broken, the bad value, and what would be valid.
* :class:`ExecutionError` (a :class:`RuntimeError`): running failed (a worker died or
  timed out, a backend raised, a link broke); the input may have been fine.

``except ReshardBaseError`` catches both. (Up to 0.1.0 ``ExecutionError`` was a
``ReshardError`` and so a ``ValueError``: a dead machine is not the caller's mistake.)
"""

from __future__ import annotations


class ReshardBaseError(Exception):
    """Base class of every error reshard raises: :class:`ReshardError` (bad input) and
    :class:`ExecutionError` (a failure while running)."""


class ReshardError(ReshardBaseError, ValueError):
    """The caller's input is wrong (base class of every such error)."""


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


class SearchError(ReshardError):
    """A stage and layout search cannot run: a model, a cluster or a limit that no
    choice satisfies (the message names the layer or the limit)."""


class ExecutionError(ReshardBaseError, RuntimeError):
    """Executing a plan failed: a worker died, timed out, or a backend raised (not a
    ``ValueError``: the input may have been fine)."""


class MissingDependencyError(ReshardError, ImportError):
    """An optional dependency a feature needs is not installed (the message names the
    extra to install)."""

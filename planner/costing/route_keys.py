"""What decides a task's route: its key in a memo of routes
(:class:`~reshard.planner.costing.cost.RouteMemo`; issue 62). A large task's key is the
same tuple hashed once by a sample of it (:class:`~reshard.planner.costing.sampled_keys.
SampledKey`): every key is made here, so keys that are equal are made alike."""

from __future__ import annotations

from reshard.planner.costing.sampled_keys import SampledKey, every
from reshard.planner.values.tasks import Task


def route_key(task: Task, piece: int, message: int, rides: bool) -> tuple[object, ...]:
    """What decides ``task``'s route (its key in a :class:`~reshard.planner.costing.cost.RouteMemo`): its kind and its
    devices in their roles, its relay piece, its bytes where the cluster charges
    messages (else 0) and whether it rides in another's message. A task of
    :data:`HASH_ONCE` receivers or more gets a :class:`~reshard.planner.costing.
    sampled_keys.SampledKey` (the same tuple, hashed once by a sample of it: every key
    of so many receivers is made so, here)."""
    key = (task.kind, task.root, task.receivers, task.parents, task.addends,
           task.addend_parents, piece, message, rides)
    if len(task.receivers) < HASH_ONCE:
        return key
    return SampledKey.of(key, (task.kind, task.root, every(task.receivers, KEY_STRIDE),
                               every(task.parents, KEY_STRIDE), task.addends,
                               task.addend_parents, piece, message, rides))


HASH_ONCE = 64
"""Receivers from which a task's route key is hashed once, by a sample
(:func:`route_key`): a key of a thousand receivers and parents takes some 16 us to hash
whole, and :func:`~reshard.planner.costing.cost.task_routes` looks each up and stores it
(fewer: the plain tuple, cheaper to make; a 4x8 plan's tasks are all of these)."""

KEY_STRIDE = 32
"""A large route key's sample: every this many receivers and parents."""


__all__ = ["HASH_ONCE", "KEY_STRIDE", "route_key"]

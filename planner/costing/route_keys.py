"""What decides a task's route: its key in a memo of routes
(:class:`~reshard.planner.costing.cost.RouteMemo`; issue 62). A large task's key is the
same tuple hashed once by a sample of it (:class:`~reshard.planner.costing.sampled_keys.
SampledKey`): every key is made here, so keys that are equal are made alike."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from operator import itemgetter

from reshard.cluster import pipeline_piece
from reshard.planner.costing.sampled_keys import SampledKey, every, every_many
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


def route_keys(tasks: Sequence[Task], relay_piece: int, per_message: bool,
               riders: Collection[int]) -> list[tuple[object, ...]]:
    """:func:`route_key` of each of ``tasks`` on a cluster of ``relay_piece``
    (``Cluster.relay_piece``), ``per_message``: whether it charges each task's bytes
    by message, ``riders``: the places of the tasks that ride in another's message.
    Every key is made here as :func:`route_key` makes it, without a call a task: the
    plain tuples first, then those of :data:`HASH_ONCE` receivers or more sampled
    together (:func:`sampled_keys`)."""
    keys: list[tuple[object, ...]]
    if relay_piece or per_message or riders:
        keys = [(t.kind, t.root, t.receivers, t.parents, t.addends, t.addend_parents,
                 pipeline_piece(relay_piece, t.nbytes), t.nbytes if per_message else 0,
                 i in riders) for i, t in enumerate(tasks)]
    else:
        keys = [(t.kind, t.root, t.receivers, t.parents, t.addends, t.addend_parents, 0, 0,
                 False) for t in tasks]
    lens = list(map(len, map(itemgetter(2), keys)))  # each task's receivers, in C
    if lens and max(lens) >= HASH_ONCE:
        big = [i for i, n in enumerate(lens) if n >= HASH_ONCE]
        for i, key in zip(big, sampled_keys([keys[i] for i in big])):
            keys[i] = key
    return keys


def sampled_keys(keys: Sequence[tuple[object, ...]]) -> list[SampledKey]:
    """The :class:`~reshard.planner.costing.sampled_keys.SampledKey` :func:`route_key`
    makes of each of the plain route ``keys`` (tasks of :data:`HASH_ONCE` receivers or
    more), in a few calls for them all (the same keys, the same samples)."""
    receivers = every_many([k[2] for k in keys], KEY_STRIDE)  # type: ignore[misc]
    parents = every_many([k[3] for k in keys], KEY_STRIDE)  # type: ignore[misc]
    return SampledKey.many(keys, [(k[0], k[1], r, p, *k[4:])
                                  for k, r, p in zip(keys, receivers, parents)])


HASH_ONCE = 64
"""Receivers from which a task's route key is hashed once, by a sample
(:func:`route_key`): a key of a thousand receivers and parents takes some 16 us to hash
whole, and :func:`~reshard.planner.costing.cost.task_routes` looks each up and stores it
(fewer: the plain tuple, cheaper to make; a 4x8 plan's tasks are all of these)."""

KEY_STRIDE = 32
"""A large route key's sample: every this many receivers and parents."""


__all__ = ["HASH_ONCE", "KEY_STRIDE", "route_key", "route_keys", "sampled_keys"]

"""Ids that stand in one group each, none negative: a cluster's device ids over its
hosts, a sharding spec's mesh axes over the tensor's dims. One walk that indexes each id
by its group and refuses the first one out of place, with the caller's own errors."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def group_of_each(groups: Sequence[Sequence[int]],
                  negative: Callable[[int, int], Exception],
                  twice: Callable[[int, int, int], Exception]) -> dict[int, int]:
    """Each id in ``groups`` and the index of the group it stands in, in order; raises
    ``negative(id, group)`` for the first id below 0 and ``twice(id, first, group)`` for
    the first one that stands in a second place (``first``: its group before)."""
    seen: dict[int, int] = {}
    for g, ids in enumerate(groups):
        for i in ids:
            if i < 0:
                raise negative(i, g)
            if i in seen:
                raise twice(i, seen[i], g)
            seen[i] = g
    return seen


__all__ = ["group_of_each"]

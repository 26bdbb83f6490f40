"""The plans a Runtime keeps loaded on its workers: pinned ones (loaded by the caller,
until unloaded) and a cache of the most recently run ones, at most ``max_plans``,
least recently used unloaded first. Each plan is known to its workers by an id."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from reshard.planner.ir import ReshardPlan

Key = tuple[ReshardPlan, str | None]
"""A loaded plan: the plan and its channel (plans on other channels are loaded apart)."""


class LoadedPlans:
    """Plan ids by (plan, channel), and which to unload when the cache is full."""

    def __init__(self, max_plans: int) -> None:
        self.max_plans = max_plans
        self._cached: OrderedDict[Key, int] = OrderedDict()
        self._pinned: dict[Key, int] = {}

    def __len__(self) -> int:
        return len(self._cached) + len(self._pinned)

    def find(self, key: Key, pin: bool) -> int | None:
        """The id of a loaded plan (None: not loaded); ``pin`` moves a cached one to
        the pinned, else it becomes the most recently used."""
        pid = self._pinned.get(key)
        if pid is not None:
            return pid
        pid = self._cached.get(key)
        if pid is not None:
            if pin:
                del self._cached[key]
                self._pinned[key] = pid
            else:
                self._cached.move_to_end(key)
        return pid

    def add(self, key: Key, pid: int, pin: bool) -> None:
        """Record a plan just loaded under ``pid``."""
        (self._pinned if pin else self._cached)[key] = pid

    def evicted(self) -> Iterator[tuple[ReshardPlan, int]]:
        """The cached plans over :attr:`max_plans`, least recently used first, each
        forgotten as it is yielded (the caller unloads them)."""
        while len(self._cached) > self.max_plans:
            (plan, _), pid = self._cached.popitem(last=False)
            yield plan, pid

    def drop(self, key: Key) -> int | None:
        """Forget a plan (pinned or cached); its id, or None where it was not loaded."""
        pid = self._pinned.pop(key, None)
        return self._cached.pop(key, None) if pid is None else pid


__all__ = ["Key", "LoadedPlans"]

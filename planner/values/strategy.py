"""Strategy: how a plan moves each slice. Parsed once at the API boundary."""

from __future__ import annotations

import enum

from reshard.choice import parse_choice
from reshard.errors import StrategyError


class Strategy(enum.Enum):
    """Transfer strategy of a plan.

    * ``SEND_RECV``: every destination device receives every slice it needs point to
      point from one holder.
    * ``ALLGATHER``: every destination host receives each slice once, split over its
      devices, then all-gathers it inside the host (Alpa's local all-gather).
    * ``BROADCAST``: one broadcast per slice from one holder to all its needers, so a
      slice crosses each host boundary once (the cross-mesh resharding paper).
    """

    SEND_RECV = "send_recv"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"

    @classmethod
    def parse(cls, value: str | Strategy) -> Strategy:
        """Accept a Strategy or its name; raise listing the valid names."""
        return parse_choice(cls, value, "strategy", StrategyError)

    def __str__(self) -> str:
        return self.value

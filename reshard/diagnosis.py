"""Why a Runtime's call failed: which workers died, which were stuck, what the others
reported, and the tasks of a plan a dead device was in (one error naming them all)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future, wait
from typing import Any

from reshard.planner.ir import ReshardPlan

REPORT_GRACE = 1.0
"""Seconds the other workers get to say which task they were on."""

DEATH_NOTICE = 0.5
"""Seconds the launcher gets to notice a dead worker its peers reported."""


def deaths(group: Any, calls: list[tuple[int, Future]], within: float) -> dict[int, str]:
    """The dead workers of ``group``, after giving the launcher up to ``within``
    seconds to notice the death of a worker whose call is still open (peers that lost
    it may report before the launcher has reaped it)."""
    end = time.monotonic() + within
    while True:
        dead: dict[int, str] = dict(group.dead())
        if time.monotonic() >= end or all(f.done() or d in dead for d, f in calls):
            return dead
        time.sleep(0.02)


def collect_reports(waiting: set[Future], grace: float = REPORT_GRACE) -> None:
    """Give workers up to ``grace`` seconds to report which task they failed on (their
    own timeouts fire just after the driver's); once one has, the rest get 0.1 s."""
    end = time.monotonic() + grace
    while waiting:
        left = end - time.monotonic()
        if left <= 0:
            return
        done, waiting = wait(waiting, timeout=left, return_when="FIRST_COMPLETED")
        if not done:
            return
        end = min(end, time.monotonic() + 0.1)


def describe_failure(calls: list[tuple[int, Future]], what: str, stuck: list[int],
                     dead: Mapping[int, str], limit: float,
                     plan: ReshardPlan | None = None) -> str:
    """One message: the dead devices (and their tasks of ``plan``), the stuck ones, and
    each distinct error the others reported (eight at most)."""
    parts = []
    for d, why in sorted(dead.items()):
        parts.append(f"device {d} died ({why}){its_tasks(plan, d)}")
    for d in stuck:
        if d not in dead:
            parts.append(f"device {d} made no progress for {limit:g}s (stuck)"
                         f"{its_tasks(plan, d)}")
    seen = set()
    for d, f in sorted(calls, key=lambda c: c[0]):
        if f.done() and f.exception() is not None and d not in dead:
            exc = f.exception()
            text = str(exc) or f"device {d}: {type(exc).__name__} (no message)"
            if text not in seen:
                seen.add(text)
                parts.append(text)
    if not parts:
        parts.append(f"devices {sorted(d for d, f in calls if not f.done())} had not "
                     f"answered when the call failed; none reported why")
    return f"{what} failed: " + "; ".join(parts[:8]) + (
        f" (+{len(parts) - 8} more)" if len(parts) > 8 else "")


def its_tasks(plan: ReshardPlan | None, device: int, most: int = 3) -> str:
    """``", in task #i (...), ..."``: the tasks of ``plan`` that ``device`` takes part
    in (peers that had sent everything to it may finish without noticing its death)."""
    if plan is None:
        return ""
    mine = [i for i, t in enumerate(plan.tasks) if device in t.devices]
    if not mine:
        return ""
    shown = ", ".join(f"task #{i} ({plan.tasks[i]})" for i in mine[:most])
    more = f" and {len(mine) - most} more" if len(mine) > most else ""
    return f", in {shown}{more}"


__all__ = ["DEATH_NOTICE", "REPORT_GRACE", "collect_reports", "deaths", "describe_failure",
           "its_tasks"]

"""Work on the serving threads: light work runs on any of them, heavier work on a few
at a time.

A request the budget deems cheap enough to run on a serving thread
(:mod:`reshard.service.budget`: its work at most :data:`~reshard.service.budget.INLINE_WORK`
cells) may still take a tenth of a second of CPU, and every serving thread shares one
interpreter: eight such calls at once hold all eight threads, and a small call waits for
one to come free (measured: 8 threads repeating distinct 512 -> 512 Estimates, ~60 ms
each, left a good client's small Estimates p99 585 ms on 2 cores). So work above
:data:`LIGHT_WORK` needs one of :data:`SLOTS` slots; a call that finds none free sends
its work to a job worker instead (:mod:`reshard.service.workpool`, which refuses it while
every worker is busy). At most ``SLOTS + --job-workers`` serving threads are then busy
with anything but light work, the rest free for small calls.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

LIGHT_WORK = 1024
"""Work (in cells: :func:`reshard.service.budget.work`) any serving thread does at once:
about 20 ms (a 64 -> 64 S0 move over 16 hosts is 640, planned in ~11 ms)."""

SLOTS = 1
"""Serving threads doing more than light work at once (8 threads repeating distinct 512
-> 512 Estimates: a good client's p99 146 ms with one slot, 225 ms with two, 585 ms
without slots; 1-request EstimateMany batches of the same: 139, 180 and 439 ms)."""


class InlineSlots:
    """The slots of heavier inline work (module docstring).

    Args:
        size: serving threads that may do more than light work at once.
    """

    def __init__(self, size: int = SLOTS) -> None:
        self.size = size
        self._free = threading.BoundedSemaphore(size)

    @contextlib.contextmanager
    def hold(self, work: int) -> Iterator[bool]:
        """Whether ``work`` may run on this serving thread now (light work always;
        heavier work when a slot is free, held until the block ends)."""
        if work <= LIGHT_WORK:
            yield True
            return
        if not self._free.acquire(blocking=False):
            yield False
            return
        try:
            yield True
        finally:
            self._free.release()


__all__ = ["LIGHT_WORK", "SLOTS", "InlineSlots"]

"""Ending a benchmark's worker processes: wait for each a while, then kill and reap what
is left (a calibration's streaming pairs, the bare-transport replay's ranks, the JAX
processes' side by side)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def reap(procs: Iterable[Any], wait: float = 30.0) -> None:
    """Join each of ``procs`` (``multiprocessing`` processes) for up to ``wait`` seconds;
    kill one still alive, and join it."""
    for p in procs:
        p.join(wait)
        if p.is_alive():
            p.kill()
            p.join()


__all__ = ["reap"]

"""Benchmark suites: :data:`SUITES` maps a suite name to a function returning its
cases (:class:`reshard.microbench.suites.paper.Case`).

* ``paper``, ``n-to-m``, ``1-to-m``: the paper's microbenchmarks (paper.py);
* ``realistic``: layout pairs of real training runs at real sizes (realistic.py);
* ``weight-sync``: RL weight sync of a 7B model, FSDP -> TP, one plan (weight_sync.py).
"""

from __future__ import annotations

from collections.abc import Callable

from reshard.microbench.suites import paper, realistic, weight_sync
from reshard.microbench.suites.paper import Case

SUITES: dict[str, Callable[[], tuple[Case, ...]]] = {
    **paper.SUITES, **realistic.SUITES, **weight_sync.SUITES}

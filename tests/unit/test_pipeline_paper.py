"""The simulator on the paper's setting, with transfer times from the planner."""

from __future__ import annotations

import pytest

from reshard.pipeline.compare import paper_setting, paper_transfer
from reshard.presets import GBIT


def test_paper_transfer_is_the_planners_broadcast_time():
    # a replicated 32 MB activation crosses one 10 Gbit/s host boundary once
    assert paper_transfer(32) == pytest.approx(32e6 / (10 * GBIT), rel=0.02)


def test_eager_beats_1f1b_when_transfers_are_exposed_and_costs_memory():
    rows = paper_setting(0.03, 0.06, [0.01, 64])
    t = {(r["activation_MB"], r["schedule"]): r for r in rows}
    tiny, big = 0.01, 64
    # transfers negligible: the two schedules take the same time
    assert t[(tiny, "eager-1f1b")]["iteration_time"] == pytest.approx(
        t[(tiny, "1f1b")]["iteration_time"], rel=0.01)
    # a transfer comparable to a forward: eager hides it, 1F1B waits for it
    assert t[(big, "eager-1f1b")]["iteration_time"] < 0.8 * t[(big, "1f1b")]["iteration_time"]
    # ... for more activations in flight on the first stage (2n-1 instead of n)
    assert t[(big, "eager-1f1b")]["peak_activations"][0] == 7
    assert t[(big, "1f1b")]["peak_activations"][0] == 4

"""The search's choice and Alpa's run with real bytes on the emulated testbed
(python -m reshard.microbench.search_testbed), small: both choices run under 1F1B by
the pipeline runtime, alternated on one runtime, and each row's simulated time is the
simulator's of that choice."""

from __future__ import annotations

import argparse
import math

import pytest

pytestmark = pytest.mark.cpu


@pytest.mark.netns
@pytest.mark.timeout(300)
def test_both_choices_run_on_the_testbed():
    from reshard.testbed import available

    ok = available()
    if not ok:
        pytest.skip(f"no netns testbed: {ok.reason}")
    from reshard.microbench import search_testbed

    args = argparse.Namespace(layers=4, layer_ms=30.0, overhead=0.25, rows=512,
                              microbatches=4, nic_mbit=400.0, timeout=120.0, warmup=0,
                              iters=1)
    rows = search_testbed.run(args)
    assert [r["choice"] for r in rows] == ["reshard", "alpa"]
    for r in rows:
        assert r["measured_s"] > 0 and len(r["steps_s"]) == 1
        assert math.isfinite(r["sim_err"])
        assert r["objective_s"] > 0 and r["simulated_s"] > 0
    # the search's choice is no slower in the objective than the moves-free one, priced
    assert rows[0]["objective_s"] <= rows[1]["objective_s"] * (1 + 1e-9)

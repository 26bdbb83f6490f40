"""``python -m reshard.microbench.cast_plans``: a case planned blind to the cast rate and
aware of it, both run on real tcp workers and checked; the aware plan is the cheaper one
by the model that knows the rate."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.cpu


@pytest.mark.timeout(240)
def test_cast_aware_and_blind_plans_run_and_are_checked(monkeypatch, tmp_path, capsys):
    from reshard.microbench import calibrate, cast_plans

    # this machine's links as --cluster local measures them (fixed: the test is not
    # about them); the cast rate is measured for real through the case's workers
    monkeypatch.setattr(calibrate, "measure_many", lambda counts, backend=None: {
        p: calibrate.Links(2e9, 5e-5, 5e9, p, 3e9) for p in counts})
    out = tmp_path / "cast.json"
    assert cast_plans.main(["--cases", "5", "-b", "1M", "-n", "2", "-w", "1",
                            "--backend", "tcp", "-J", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["case"] == "5" and row["wrong"] == 0 and row["cast_bandwidth"] > 0
    assert len(row["blind_all_s"]) == len(row["aware_all_s"]) == 2
    # both modelled with the measured rate: the aware plan is no dearer than the blind
    assert (row["aware_model_over_measured"] * row["aware_s"]
            <= row["blind_model_over_measured"] * row["blind_s"] * (1 + 1e-9))
    assert row["aware_over_bound"] == pytest.approx(row["aware_s"] / row["bound_s"])
    assert "aware/blind" in capsys.readouterr().out

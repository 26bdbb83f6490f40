"""The search benchmark (reshard-bench --suite search): each row's choices priced by
one objective, reshard's never slower than a baseline; the CLI hands the suite over
with its own flags."""

from __future__ import annotations

import pytest

from reshard.microbench import cli, search_bench


@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", [("u", "gpt-350m", "aws-p3.8xlarge", 2, 4),
                                    ("moe32", "gpt-350m", "aws-p3.8xlarge", 2, 4),
                                    ("gpt", "gpt-350m", "dgx-h100", 1, 8)])
def test_a_row_prices_three_choices_and_reshard_never_simulates_slower(config):
    row = search_bench.run(config, "1f1b")
    assert row["reshard_sim_s"] <= row["alpa_sim_s"] * (1 + 1e-9)
    assert row["reshard_sim_s"] <= row["megatron_sim_s"] * (1 + 1e-9)
    assert row["vs_alpa"] == pytest.approx(row["alpa_sim_s"] / row["reshard_sim_s"])
    assert row["reshard_s"] > 0
    if config[0] != "u":  # the objective's own best is never above the pick's objective
        assert row["objective_best_s"] <= row["reshard_s"] * (1 + 1e-9)
        assert row["objective_best_sim_s"] >= row["reshard_sim_s"] * (1 - 1e-9)


def test_the_cli_hands_the_search_suite_its_own_flags(monkeypatch, capsys):
    assert cli._search_argv(["--suite", "search", "--quick"]) == ["--quick"]
    assert cli._search_argv(["-J", "x.json", "--suite=search"]) == ["-J", "x.json"]
    assert cli._search_argv(["--suite", "paper"]) is None
    monkeypatch.setattr(search_bench, "CONFIGS", (("gpt", "gpt-350m", "dgx-h100", 1, 4),))
    assert cli.main(["--suite", "search", "--schedule", "eager-1f1b"]) == 0
    out = capsys.readouterr().out
    assert "schedule eager-1f1b" in out
    assert "simulates slower than a baseline in 0 of 1 rows" in out

"""The command-line tools: reshard-bench (the README's main job) and reshard plan."""

from __future__ import annotations

import json

from reshard import cli as reshard_cli
from reshard.microbench import cli as bench_cli


def test_bench_sim_mode_checks_and_reports(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = bench_cli.main(["--suite", "n-to-m", "--cases", "1,7", "--check-elements", "512",
                           "-J", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "model/bound" in text and "#wrong" in text and "Out of bounds values : 0 OK" in text
    rows = json.loads(out.read_text())["rows"]
    assert {(r["case"], r["strategy"]) for r in rows} == {
        (c, s) for c in ("1", "7") for s in ("send_recv", "allgather", "broadcast")}
    assert all(r["wrong"] == 0 for r in rows)
    bcast = [r for r in rows if r["strategy"] == "broadcast"]
    assert all(r["ratio"] <= 1.10 for r in bcast)


def test_bench_sizes_follow_nccl_tests_flags(capsys):
    code = bench_cli.main(["--suite", "1-to-m", "--cases", "1-to-m 2x2", "-b", "1M", "-e", "4M",
                           "-f", "2", "-c", "0", "--strategies", "broadcast"])
    text = capsys.readouterr().out
    assert code == 0
    sizes = [line.split()[3] for line in text.splitlines() if "broadcast" in line
             and not line.startswith("#")]
    assert sizes == ["1048576", "2097152", "4194304"]


def test_bench_run_mode_on_local_backend(capsys):
    code = bench_cli.main(["--mode", "run", "--backend", "local", "--suite", "n-to-m",
                           "--cases", "5", "-b", "64K", "-n", "1", "-w", "0"])
    assert code == 0
    assert "time(us)" in capsys.readouterr().out


def test_bench_run_mode_moves_many_tensors_in_one_plan(tmp_path, capsys):
    out = tmp_path / "run.json"
    code = bench_cli.main(["--mode", "run", "--backend", "local", "--suite", "weight-sync",
                           "--cases", "weight-sync-2l", "-b", "256K", "-n", "1", "-w", "0",
                           "--devices-per-host", "2", "--strategies", "broadcast",
                           "-J", str(out)])
    assert code == 0
    assert "fsdp:S01@4x2->tp:S1/RS1/R@2x2" in capsys.readouterr().out
    (row,) = json.loads(out.read_text())["rows"]
    assert row["tensors"] == 21 and row["shape"] == "21-tensors" and row["wrong"] == 0


def test_bench_rejects_unknown_case_names(capsys):
    try:
        bench_cli.main(["--suite", "n-to-m", "--cases", "1,42"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("an unknown case name was accepted")
    assert "unknown case(s) ['42']" in capsys.readouterr().err


def test_reshard_plan_cli(tmp_path, capsys):
    path = tmp_path / "plan.json"
    code = reshard_cli.main(["plan", "--shape", "64,32,8", "--dtype", "int32", "--src-mesh",
                             "2x4", "--src-spec", "RS0R", "--dst-mesh", "2x4@8", "--dst-spec",
                             "S0RR", "--hosts", "4x4", "--json", str(path)])
    assert code == 0
    assert "broadcast" in capsys.readouterr().out
    assert json.loads(path.read_text())["strategy"] == "broadcast"
    code = reshard_cli.main(["plan", "--shape", "8,8", "--src-mesh", "2", "--src-spec", "S1R",
                             "--dst-mesh", "2", "--dst-spec", "RR"])
    assert code == 2
    assert "out of range" in capsys.readouterr().err

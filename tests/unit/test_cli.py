"""The command-line tools: reshard-bench (the README's main job), the shared benchmark
flags, and reshard plan.

Every usage error and would-be no-op of reshard-bench ends in one line and exit code 2;
numbers in the rows are compared with the planner's own estimate and bound for the
same layouts on an independently built cluster; the progress bar is checked not to
tear the table on a (fake) terminal."""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest

import reshard
from reshard import cli as reshard_cli
from reshard.microbench import cli as bench_cli
from reshard.microbench import dataplane, flags, soak, sweep
from reshard.microbench.report import Progress, Shape, Stream, table
from reshard.microbench.suites.paper import n_to_m_cases

ALL = ("send_recv", "allgather", "broadcast")


def _bench(argv, capsys):
    """(exit code, stdout, stderr); a usage error's SystemExit counts as its code."""
    try:
        code = bench_cli.main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _case(name):
    return next(c for c in n_to_m_cases() if c.name == name)


# ----- sim mode -------------------------------------------------------------------------------
def test_sim_rows_equal_the_planners_own_numbers(tmp_path, capsys):
    path = tmp_path / "bench.json"
    code, out, _ = _bench(["--suite", "n-to-m", "--cases", "1,7", "--check-elements", "512",
                           "-J", str(path)], capsys)
    assert code == 0
    assert "model/bound" in out and "#wrong" in out and "Out of bounds values : 0 OK" in out
    assert "at about 512 elements per tensor" in out  # the check size is stated
    doc = json.loads(path.read_text())
    rows = doc["rows"]
    assert [(r["case"], r["strategy"]) for r in rows] == [(c, s) for c in "17" for s in ALL]
    for r in rows:
        reqs, cluster = _case(r["case"]).build_many()
        p = reshard.plan_many(reqs, cluster=cluster, strategy=r["strategy"])
        assert r["model_us"] == pytest.approx(p.estimate() * 1e6)
        assert r["lb_us"] == pytest.approx(p.lower_bound() * 1e6)
        assert r["model_algbw_gbps"] == pytest.approx(r["bytes"] / p.estimate() / 1e9)
        assert r["bound_algbw_gbps"] == pytest.approx(r["bytes"] / p.lower_bound() / 1e9)
        assert r["src"] == str(reqs[0][2]) and r["dst"] == str(reqs[0][3])
        assert r["dtype"] == "int32" and r["measured_us"] is None and r["wrong"] == 0
        assert r["checked_bytes"] < r["bytes"]  # checked small, and the row says so
    assert all(r["model_over_bound"] <= 1.10 for r in rows if r["strategy"] == "broadcast")


def test_json_has_a_schema_and_the_same_row_keys_in_both_modes(tmp_path, capsys):
    sim, run = tmp_path / "sim.json", tmp_path / "run.json"
    base = ["--suite", "n-to-m", "--cases", "5", "-b", "4K", "--strategies", "broadcast"]
    assert _bench([*base, "-J", str(sim)], capsys)[0] == 0
    assert _bench([*base, "--mode", "run", "--backend", "local", "-n", "2", "-w", "0",
                   "-J", str(run)], capsys)[0] == 0
    s, r = json.loads(sim.read_text()), json.loads(run.read_text())
    assert s.keys() == r.keys()
    assert s["schema_version"] == r["schema_version"] == bench_cli.SCHEMA_VERSION
    assert (s["mode"], s["backend"], s["iterations"]) == ("sim", None, None)
    assert (r["mode"], r["backend"], r["launcher"], r["iterations"], r["warmup"]) == (
        "run", "local", "thread", 2, 0)
    for key in ("platform", "python", "cpu_count", "reshard"):
        assert s["machine"][key] is not None
    assert s["machine"]["reshard"] == reshard.__version__
    (srow,), (rrow,) = s["rows"], r["rows"]
    assert srow.keys() == rrow.keys()
    assert srow["model_us"] == pytest.approx(rrow["model_us"])
    assert rrow["measured_us"] > 0 and len(rrow["measured_all_us"]) == 2
    assert rrow["measured_over_bound"] == pytest.approx(rrow["measured_us"] / rrow["lb_us"])
    assert rrow["checked_bytes"] == rrow["bytes"] and rrow["wrong"] == 0


def test_sizes_follow_nccl_tests_flags(tmp_path, capsys):
    path = tmp_path / "b.json"
    code, _, _ = _bench(["--suite", "1-to-m", "--cases", "1-to-m 2x2", "-b", "1M", "-e", "4M",
                         "-f", "2", "-c", "0", "--strategies", "broadcast", "-J", str(path)],
                        capsys)
    assert code == 0
    doc = json.loads(path.read_text())
    assert doc["sizes"] == [1 << 20, 2 << 20, 4 << 20]
    assert [r["bytes"] for r in doc["rows"]] == [1 << 20, 2 << 20, 4 << 20]


def test_sizes_that_round_to_one_shape_run_once(tmp_path, capsys):
    path = tmp_path / "b.json"
    assert _bench(["--suite", "n-to-m", "--cases", "1", "-b", "1", "-e", "4", "-c", "0",
                   "--strategies", "broadcast", "-J", str(path)], capsys)[0] == 0
    assert [r["bytes"] for r in json.loads(path.read_text())["rows"]] == [4]  # one int32


def test_sim_mode_places_meshes_on_hosts_and_devices_per_host(tmp_path, capsys):
    path = tmp_path / "b.json"
    assert _bench(["--suite", "n-to-m", "--cases", "1", "--hosts", "3", "--devices-per-host",
                   "2", "-c", "0", "--strategies", "broadcast", "-J", str(path)], capsys)[0] == 0
    (row,) = json.loads(path.read_text())["rows"]
    assert (row["hosts"], row["devices_per_host"]) == (3, 2)
    assert row["layouts"] == "S0RR@2x2->S0RR@2x2"
    cluster = reshard.Cluster.regular(3, 2)  # the destination shares host 1 with the source
    case = _case("1").narrowed(2)
    p = reshard.plan_many(case.requests_on(cluster), cluster=cluster, strategy="broadcast")
    assert row["model_us"] == pytest.approx(p.estimate() * 1e6)
    assert row["dst"] == str(case.requests_on(cluster)[0][3])


def test_goal_line_says_missed_when_missed(capsys):
    # a 64 KiB partial sum over four hosts is latency-bound: its model misses the goal
    code, out, _ = _bench(["--suite", "realistic", "--cases", "partial-h100-4x8", "-b", "64K",
                           "-e", "64K", "-c", "0", "--strategies", "broadcast"], capsys)
    assert code == 0
    (goal,) = [line for line in out.splitlines() if line.startswith("# goal")]
    assert "MISSED in 1 of 1 rows, case partial-h100-4x8" in goal
    code, out, _ = _bench(["--suite", "n-to-m", "--cases", "1", "-c", "0"], capsys)
    assert "# goal broadcast model/bound <= 1.10: met in all 1 rows" in out


def test_no_correctness_line_when_nothing_was_checked(capsys):
    code, out, _ = _bench(["--suite", "n-to-m", "--cases", "1", "-c", "0"], capsys)
    assert code == 0
    assert "Out of bounds" not in out and "# correctness not checked (-c 0)" in out
    assert "#wrong" not in out


def test_rows_stream_before_the_sweep_ends(monkeypatch, capsys):
    seen: list[str] = []
    real = sweep.check_small

    def spy(p, strategy):
        seen.append(capsys.readouterr().out)  # what was printed before this check
        return real(p, strategy)

    monkeypatch.setattr(sweep, "check_small", spy)
    assert bench_cli.main(["--suite", "n-to-m", "--cases", "1,7", "--check-elements",
                           "256", "--strategies", "broadcast"]) == 0
    assert "src->dst" in seen[0] and "S0RR@2x4" not in seen[0]  # the header, no row yet
    assert "S0RR@2x4->S0RR@2x4" in seen[1] and "S1RR" not in seen[1]  # case 1's row


# ----- run mode -----------------------------------------------------------------------------
def test_run_mode_on_the_local_backend_is_inferred_from_run_flags(tmp_path, capsys):
    path = tmp_path / "run.json"
    code, out, _ = _bench(["--backend", "local", "--suite", "n-to-m", "--cases", "5",
                           "-b", "64K", "-n", "1", "-w", "0", "-J", str(path)], capsys)
    assert code == 0
    assert "mode run" in out and "time(us)" in out and "# measured:" in out
    rows = json.loads(path.read_text())["rows"]
    assert [r["strategy"] for r in rows] == list(ALL) and all(r["wrong"] == 0 for r in rows)


def test_run_mode_moves_many_tensors_in_one_plan(tmp_path, capsys):
    path = tmp_path / "run.json"
    code, out, _ = _bench(["--mode", "run", "--backend", "local", "--suite", "weight-sync",
                           "--cases", "weight-sync-2l", "-b", "256K", "-n", "1", "-w", "0",
                           "--devices-per-host", "2", "--strategies", "broadcast",
                           "-J", str(path)], capsys)
    assert code == 0
    assert "fsdp:S01@4x2->tp:S1/RS1/R@2x2" in out and "21 tensors" in out
    (row,) = json.loads(path.read_text())["rows"]
    assert row["tensors"] == 21 and row["wrong"] == 0


def test_run_mode_refusing_every_case_exits_2(capsys):
    code, out, err = _bench(["--mode", "run", "--backend", "local", "--suite", "n-to-m",
                             "--cases", "1", "-b", "4K", "--max-devices", "4"], capsys)
    assert code == 2
    assert "# refused 1 (" in out and "more than --max-devices 4" in out
    assert "every case was refused" in err


# ----- errors and no-ops: one line, exit code 2 ---------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["-b", "64M", "-e", "1M"], "-b 64 MiB is larger than -e 1 MiB"),
    (["--cases", "99"], "no case '99' in suite paper; valid: 1, 2, 3, 4, 5, 6, 7, 9, 1-to-m"),
    (["--cases", ""], "--cases: the selection is empty; name cases of suite paper: 1, 2"),
    (["--cases", ","], "--cases: the selection is empty"),
    (["--strategies", "bcast"], ("unknown strategy 'bcast'; valid strategies: send_recv, "
                                 "allgather, broadcast")),
    (["--strategies", ","], "no strategy given"),
    (["-f", "4"], "-f/--stepfactor sets the factor of a sweep"),
    (["-b", "1M", "-e", "4M", "-f", "1"], "expected an integer >= 2, got 1"),
    (["-b", "0"], "a size must be at least 1 byte"),
    (["-b", "12Q"], "bad size '12Q'"),
    (["-n", "0", "--mode", "run"], "expected an integer >= 1, got 0"),
    (["--mode", "sim", "--backend", "gloo"], "--backend: these apply to --mode run only"),
    (["--mode", "sim", "-n", "3"], "-n/--iters: these apply to --mode run only"),
    (["--mode", "sim", "-w", "0"], "-w/--warmup: these apply to --mode run only"),
    (["--mode", "sim", "--launcher", "process"], "--launcher: these apply"),
    (["--mode", "sim", "--timeout", "5"], "--timeout: these apply"),
    (["--mode", "sim", "--max-devices", "8"], "--max-devices: these apply"),
    (["--mode", "run", "--check-elements", "64"], "--check-elements: sim mode only"),
    (["-c", "0", "--check-elements", "64"], "-c 0 turns it off"),
    (["-c", "2"], "invalid choice: 2 (choose from 0, 1)"),
    (["--backend", "mpi"], "invalid choice: 'mpi' (choose from 'local', 'gloo', 'nccl', 'tcp', 'nixl')"),
    (["--suite", "n-to-m", "--hosts", "1"], "needs at least 2 hosts"),
    (["--plot", "out.gif"], "must be one of .png, .svg, .pdf"),
    (["-J", "/no/such/folder/b.json"], "folder /no/such/folder does not exist"),
    (["--minb", "1M"], "unrecognized arguments"),  # no abbreviations
])
def test_usage_errors_are_one_line_and_exit_2(argv, message, capsys):
    code, out, err = _bench(argv, capsys)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert out == ""  # nothing ran


def test_launcher_the_backend_cannot_use_is_one_clean_line(capsys):
    for argv in (["--backend", "gloo", "--launcher", "thread"],
                 ["--backend", "local", "--launcher", "process"]):
        code, _, err = _bench([*argv, "--suite", "n-to-m", "--cases", "1", "-b", "1K"], capsys)
        assert code == 2
        (line,) = err.strip().splitlines()
        assert line.startswith("reshard-bench: error: ") and "launcher" in line


def test_nccl_without_a_gpu_is_one_clean_line(capsys):
    from reshard.comm.backends.nccl import available

    if available():
        pytest.skip("this machine has a GPU with NCCL")
    code, out, err = _bench(["--backend", "nccl", "--cases", "1", "-b", "1M"], capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert "--backend nccl needs cupy and an NVIDIA GPU" in line


def test_plot_without_matplotlib_fails_before_running(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    code, out, err = _bench(["--suite", "n-to-m", "--plot", str(tmp_path / "b.png")], capsys)
    assert code == 2 and out == ""
    assert "needs matplotlib" in err and "reshard[plot]" in err


def test_version_and_help(capsys):
    code, out, _ = _bench(["--version"], capsys)
    assert code == 0 and reshard.__version__ in out
    ap = bench_cli.build_parser()
    undocumented = [a.option_strings for a in ap._actions
                    if a.option_strings and not (a.help or "").strip()]
    assert undocumented == []
    text = " ".join(ap.format_help().split())
    for shown in ("(default: 5)", "(default: 1)", "(default: paper)", "(default: 120.0)",
                  "(default: send_recv,allgather,broadcast)", "(default: gloo)"):
        assert shown in text


# ----- plot -----------------------------------------------------------------------------------
def test_plot_draws_each_strategys_bandwidth_and_the_bound(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from reshard.microbench import plot

    png, path = tmp_path / "b.png", tmp_path / "b.json"
    assert _bench(["--suite", "n-to-m", "--cases", "1,7", "-c", "0", "--plot", str(png),
                   "-J", str(path)], capsys)[0] == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads(path.read_text())["rows"]
    ax = plot.figure(rows).axes[0]
    heights = sorted(round(b.get_height(), 9) for b in ax.patches)
    assert heights == sorted(round(r["model_algbw_gbps"], 9) for r in rows)
    bounds = sorted(round(float(seg[0][1]), 9) for c in ax.collections
                    for seg in c.get_segments())
    assert bounds == sorted({round(r["bound_algbw_gbps"], 9) for r in rows})


# ----- progress and streaming -----------------------------------------------------------------
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _screen(raw: str) -> list[str]:
    """What a terminal shows: each line's carriage returns overwrite it from the left."""
    lines = []
    for line in raw.split("\n"):
        shown = ""
        for part in line.split("\r"):
            shown = part + shown[len(part):]
        if shown.strip():
            lines.append(shown.rstrip())
    return lines


def test_progress_bar_never_tears_the_table(monkeypatch, capsys):
    pytest.importorskip("tqdm")
    argv = ["--suite", "n-to-m", "--cases", "1,7", "--check-elements", "256"]
    assert bench_cli.main([*argv, "--no-progress"]) == 0
    plain = capsys.readouterr().out.splitlines()
    term = _Terminal()
    monkeypatch.setattr(sys, "stdout", term)
    monkeypatch.setattr(sys, "stderr", term)
    assert bench_cli.main(argv) == 0
    raw = term.getvalue()
    assert "step" in raw  # the bar was drawn
    assert _screen(raw) == plain
    term2 = _Terminal()
    monkeypatch.setattr(sys, "stdout", term2)
    monkeypatch.setattr(sys, "stderr", term2)
    assert bench_cli.main([*argv, "--no-progress"]) == 0
    assert "step" not in term2.getvalue() and "\r" not in term2.getvalue()


def test_no_bar_when_output_is_not_a_terminal(capsys):
    with Progress(3, True, "x") as p:
        assert p._bar is None
        p.write("line")
    assert capsys.readouterr() == ("line\n", "")


def test_stream_prints_each_row_at_once_in_fixed_columns(capsys):
    shape = Shape.fit([("case", "case"), ("t", "time(us)", ".1f")], [{"case": "long-name"}])
    out = Stream(shape, Progress(0, False))
    out.row({"case": "a", "t": 1.25})
    assert capsys.readouterr().out.splitlines() == [
        "     case  time(us)", "---------  --------", "        a       1.2"]
    out.row({"case": "b", "t": None})
    assert capsys.readouterr().out == "        b         -\n"


def test_table_uses_one_number_format_per_column():
    text = table([{"x": 123456.0}, {"x": 0.5}], [("x", "x")])
    assert text.splitlines()[2:] == ["1.235e+05", "5.000e-01"]
    text = table([{"x": 1.0}, {"x": 0.5}], [("x", "x")])
    assert text.splitlines()[2:] == ["1.000", "0.500"]


# ----- the other entry points share the flags ---------------------------------------------------
def test_every_entry_point_spells_the_shared_flags_alike():
    for ap in (bench_cli.build_parser(), dataplane.build_parser(), soak.build_parser()):
        args = ap.parse_args(["-n", "3", "-w", "0", "-J", "x.json", "--timeout", "5"])
        assert (args.iters, args.warmup, args.json, args.timeout) == (3, 0, "x.json", 5.0)
        assert flags.given(args) >= {"iters", "warmup", "json", "timeout"}


def test_old_spellings_are_gone(capsys):
    """A 0.x release keeps no deprecated flag spellings: each is a usage error."""
    for ap, argv in ((dataplane.build_parser(), ["--runs", "3"]),
                     (dataplane.build_parser(), ["--size-mb", "2"]),
                     (soak.build_parser(), ["--iterations", "7"]),
                     (soak.build_parser(), ["--warm", "2"])):
        with pytest.raises(SystemExit) as e:
            ap.parse_args(argv)
        assert e.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_dataplane_refuses_an_empty_sweep_and_unknown_cases(capsys):
    for argv, message in ((["-b", "4M", "-e", "1M"], "larger than -e"),
                          (["--cases", "8"], "no case '8' in suite n-to-m"),
                          (["--backend", "local"], "invalid choice: 'local'")):
        with pytest.raises(SystemExit) as e:
            dataplane.main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_sweep_sizes():
    ap = bench_cli.build_parser()
    assert flags.sizes(ap.parse_args([])) == [None]
    assert flags.sizes(ap.parse_args(["-b", "1K", "-e", "10K", "-f", "3"])) == [1024, 3072, 9216]
    assert flags.sizes(ap.parse_args(["-e", "2G"])) == [2 << 30]
    assert flags.parse_size("1.5KiB") == 1536 and flags.parse_size("64m") == 64 << 20


def test_partial_source_values_sum_to_the_value():
    layout = reshard.Layout(reshard.DeviceMesh((2, 2)), "S0R+P1")
    value = np.arange(32, dtype=np.int32).reshape(8, 4)
    with reshard.Runtime("local", reshard.Cluster.regular(2, 2), "thread") as rt:
        x = sweep.put_value(rt, value, layout, np.random.default_rng(0))
        assert np.array_equal(rt.get(x), value)


# ----- the pipeline's entry points -------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--schedule", "interleaved-1f1b", "--chunks", "1"], "needs --chunks >= 2"),
    (["--chunks", "2"], "only --schedule interleaved-1f1b runs several virtual stages"),
    (["--schedule", "interleaved-1f1b", "--stages", "dp,col,dp"],
     "--stages has 3 stage kinds, which 2 chunks per stage cannot share evenly"),
    (["--stages", "dp,xx"], "stage kinds are dp or col"),
    (["--schedule", "1f2b"], "invalid choice: '1f2b' (choose from 'gpipe', '1f1b'"),
    (["--steps", "0"], "expected an integer >= 1, got 0"),
])
def test_mlp_example_usage_errors(argv, message, capsys):
    from reshard.pipeline.examples import mlp

    with pytest.raises(SystemExit) as e:
        mlp.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_mlp_example_runtime_errors_are_one_line(capsys):
    from reshard.comm.backends.nccl import available
    from reshard.pipeline.examples import mlp

    cases = [(["--backend", "gloo", "--launcher", "thread"], "launcher")]
    if not available():
        cases.append((["--backend", "nccl"], "--backend nccl needs cupy"))
    for argv, message in cases:
        assert mlp.main(argv) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert message in line


def test_mlp_example_runs_interleaved_with_default_chunks(capsys):
    from reshard.pipeline.examples import mlp

    assert mlp.main(["--schedule", "interleaved-1f1b", "--backend", "local",
                     "--steps", "1", "--microbatches", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("OK: worst difference")


def test_pipeline_comparison_errors_are_one_line(capsys):
    from reshard.pipeline.__main__ import run

    assert run(["--schedules", "1f1b", "--transfer", "0"]) == 0
    assert "1f1b" in capsys.readouterr().out
    for argv, message in ((["--schedules", "foo"], "unknown schedule 'foo'; valid: gpipe"),
                          (["--stages", "0"], "must be an integer >= 1, got 0")):
        assert run(argv) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("python -m reshard.pipeline: error: ") and message in line


# ----- reshard plan -------------------------------------------------------------------------------
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


def test_reshard_cli_version_flags_and_terminal_help(tmp_path, capsys):
    """``reshard --version``; every ``reshard plan`` flag documented, strategies listed;
    no reST markup in any CLI's help; a device-range error names the CLI's flag."""
    with pytest.raises(SystemExit) as e:
        reshard_cli.main(["--version"])
    assert e.value.code == 0 and reshard.__version__ in capsys.readouterr().out
    ap = reshard_cli.build_parser()
    plan = ap._subparsers._group_actions[0].choices["plan"]
    undocumented = [a.option_strings for a in plan._actions
                    if a.option_strings and not (a.help or "").strip()]
    assert undocumented == []
    assert "{send_recv,allgather,broadcast}" in plan.format_help()
    from reshard import testbed
    from reshard.microbench import scaleout

    for text in (ap.format_help(), ap._subparsers._group_actions[0].choices["serve"]
                 .format_help(), bench_cli.build_parser().format_help()):
        assert "``" not in text and ":class:" not in text and ":func:" not in text
        assert "::\n" not in text
    for module in (scaleout, testbed):
        from reshard.helptext import for_terminal

        shown = for_terminal(module.__doc__)
        assert "``" not in shown and ":mod:" not in shown and ":class:" not in shown
    code = reshard_cli.main(["plan", "--shape", "8,8", "--src-mesh", "2x4", "--src-spec", "S0R",
                             "--dst-mesh", "2x4@8", "--dst-spec", "RS0", "--hosts", "2x4"])
    err = capsys.readouterr().err
    assert code == 2 and "give --hosts HOSTSxDEVICES" in err and "Cluster.regular" not in err
    code = reshard_cli.main(["plan", "--shape", "512,512", "--src-mesh", "2x4", "--src-spec",
                             "S0R", "--dst-mesh", "2x4@8", "--dst-spec", "RS0", "--hosts", "4x4",
                             "--memory-budget-mb", "0.01", "--json", str(tmp_path / "p.json")])
    assert code == 0
    tasks = json.loads((tmp_path / "p.json").read_text())["tasks"]
    assert max(len(range(*t["box"][0])) * len(range(*t["box"][1])) * 4 for t in tasks) <= 10485

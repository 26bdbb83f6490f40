"""The testbed and pipeline benchmarks take the shared benchmark flags: spelled and
parsed as reshard-bench does, old spellings kept with a warning, bad values a one-line
usage error (exit 2) that lists the valid choices, every flag explained in ``--help``.

No test here builds a testbed: the entry points' next step after their usage checks
(``available`` / ``run``) is replaced by a failure."""

from __future__ import annotations

import argparse

import pytest

from reshard.microbench import cli as bench_cli
from reshard.microbench import flags, pipeline_bench, testbed_bench
from reshard.pipeline import SCHEDULES

ENTRY_POINTS = {"testbed_bench": testbed_bench, "pipeline_bench": pipeline_bench}


@pytest.fixture(autouse=True)
def _never_build_a_testbed(monkeypatch):
    def refuse(*args, **kwargs):
        pytest.fail("a usage error was expected before the testbed is built")

    monkeypatch.setattr(testbed_bench, "available", refuse)
    monkeypatch.setattr(pipeline_bench, "run", refuse)


def _usage_error(module, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        module.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert err.strip().splitlines()[-1].startswith(f"{module.PROG}: error:"), err
    return err


def _says(err: str, message: str) -> bool:
    """``message`` in ``err``, quotes aside (argparse quotes choices on some Pythons)."""
    return message.replace("'", "") in err.replace("'", "")


def _option(ap: argparse.ArgumentParser, dest: str) -> argparse.Action:
    return next(a for a in ap._actions if a.dest == dest and a.help != argparse.SUPPRESS)


# ----- the shared flags --------------------------------------------------------------------
COMMON = ["-n", "4", "-w", "2", "-J", "x.json", "--timeout", "5", "--no-progress",
          "--launcher", "process", "--backend", "gloo", "--devices-per-host", "3"]
TESTBED_ALSO = ["--suite", "paper", "--cases", "1,7", "--strategies", "broadcast,send_recv",
                "-c", "0", "--hosts", "4"]


@pytest.mark.parametrize("name,argv", [("testbed_bench", COMMON + TESTBED_ALSO),
                                       ("pipeline_bench", COMMON)])
def test_shared_flags_parse_as_in_reshard_bench(name, argv):
    ap = ENTRY_POINTS[name].build_parser()
    ours = ap.parse_args(argv)
    theirs = bench_cli.build_parser().parse_args(argv)
    shared = [d for d in flags.FLAGS if any(a.dest == d for a in ap._actions)]
    assert {"iters", "warmup", "json", "timeout", "launcher", "devices_per_host"} <= set(shared)
    for dest in shared:
        got = getattr(ours, dest)
        if dest == "backend" and isinstance(got, tuple):  # data planes side by side
            assert got == (theirs.backend,)
            continue
        assert got == getattr(theirs, dest), dest
        assert _option(ap, dest).option_strings == list(flags.FLAGS[dest]), dest
    assert flags.given(ours) == flags.given(theirs) & set(vars(ours))
    assert ours.iters == 4 and ours.devices_per_host == 3


def test_defaults_keep_each_tools_own_values():
    tb = testbed_bench.build_parser().parse_args([])
    assert (tb.iters, tb.warmup, tb.devices_per_host, tb.hosts, tb.cases) == (3, 1, 2, None, None)
    assert (tb.suite, tb.check, tb.timeout, tb.gbit, tb.intra) == ("paper", 1, 120.0, 0.3,
                                                                   "measured")
    assert flags.given(tb) == frozenset()
    pb = pipeline_bench.build_parser().parse_args([])
    assert (pb.iters, pb.warmup, pb.devices_per_host, pb.stages) == (3, 1, 2, 4)
    assert pb.schedules == ("1f1b", "eager-1f1b") and pb.timeline_dir is None


def test_testbed_bench_runs_data_planes_side_by_side():
    """--backend takes several CPU data planes (each once, in order); the summary gives
    each one's seconds over the first's per case, and each one's model / measured."""
    args = testbed_bench.build_parser().parse_args(["--backend", "tcp, nixl,tcp,gloo"])
    assert args.backend == ("tcp", "nixl", "gloo") == flags.CPU_PLANES[1:] + flags.CPU_PLANES[:1]
    assert testbed_bench.build_parser().parse_args([]).backend == ("gloo",)

    def row(case, b, seconds, model):
        return {"case": case, "strategy": "broadcast", "backend": b, "seconds": seconds,
                "model_seconds": model}

    rows = [row("a", "tcp", 2.0, 2.0), row("a", "nixl", 2.2, 2.0), row("b", "tcp", 1.0, 0.9),
            row("b", "nixl", 0.9, 0.9)]
    assert testbed_bench.side_by_side(rows, ("tcp", "nixl")) == [
        "# nixl / tcp: a 1.10, b 0.90", "# model / measured, tcp: 0.90-1.00",
        "# model / measured, nixl: 0.91-1.00"]
    assert testbed_bench.side_by_side(rows[:1], ("tcp",)) == []


def test_json_arguments_are_json_ready():
    args = testbed_bench.build_parser().parse_args(["--cases", "1,7"])
    doc = flags.as_dict(args)
    assert doc["cases"] == ["1", "7"] and "given_flags" not in doc


# ----- old spellings -----------------------------------------------------------------------
@pytest.mark.parametrize("name,argv", [
    ("testbed_bench", ["--runs", "5"]),
    ("pipeline_bench", ["--runs", "5"]),
    ("pipeline_bench", ["--devices-per-stage", "3"]),
    ("pipeline_bench", ["--plot", "/tmp/tl"]),
])
def test_old_spellings_are_usage_errors(name, argv, capsys):
    with pytest.raises(SystemExit) as e:
        ENTRY_POINTS[name].build_parser().parse_args(argv)
    assert e.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_current_spellings_do_not_warn(name, capsys):
    args = ENTRY_POINTS[name].build_parser().parse_args(["--iters", "2", "--json", "x.json"])
    assert (args.iters, args.json) == (2, "x.json")
    assert capsys.readouterr().err == ""


# ----- bad values --------------------------------------------------------------------------
@pytest.mark.parametrize("argv,message", [
    (["--suite", "nope"], "choose from paper, realistic"),
    (["--launcher", "thread"], "choose from process, ray"),
    (["--backend", "nccl"], "expected CPU data planes from [gloo, tcp, nixl], comma-separated"),
    (["--intra", "x"], "choose from measured, preset"),
    (["--strategies", "bcast"], "valid strategies: send_recv, allgather, broadcast"),
    (["--cases", "99"], "no case '99' in suite paper; valid: 1, 2, 3, 4, 5, 6, 7, 9"),
    (["--suite", "realistic", "--cases", "1"],
     "valid: a2a-3x2, a2a-flat-2x2, rep-to-shard, 1-to-4x2, weight-sync-slice, weight-sync-slice-fp8, partial-2x2"),
    (["--cases", ","], "the selection is empty; name cases of suite paper: 1, 2"),
    (["-n", "0"], "expected an integer >= 1, got 0"),
    (["-c", "2"], "choose from 0, 1"),
    (["--gbit", "0"], "expected a number > 0"),
    (["--latency-ms", "-1"], "expected a number >= 0"),
    (["--hosts", "1"], "raise --hosts or leave it out"),
    (["-J", "/no/such/folder/x.json"], "folder /no/such/folder does not exist"),
])
def test_testbed_bench_usage_errors(argv, message, capsys):
    assert _says(_usage_error(testbed_bench, argv, capsys), message)


@pytest.mark.parametrize("argv,message", [
    (["--schedules", "foo"], "unknown schedule 'foo'; valid schedules: " + ", ".join(SCHEDULES)),
    (["--schedules", ","], "no schedule given; valid schedules: gpipe"),
    (["--schedules", "dualpipe-v", "--microbatches", "4"],
     "dualpipe-v needs at least 2 * n_stages = 8 microbatches, got 4"),
    (["--launcher", "thread"], "choose from process, ray"),
    (["--backend", "nccl"], "choose from gloo"),
    (["-w", "-1"], "expected an integer >= 0"),
    (["--devices-per-host", "0"], "expected an integer >= 1"),
    (["--timeline-dir", "/no/such/folder"], "no such folder"),
    (["-J", "/no/such/folder/x.json"], "folder /no/such/folder does not exist"),
])
def test_pipeline_bench_usage_errors(argv, message, capsys):
    assert _says(_usage_error(pipeline_bench, argv, capsys), message)


def test_timeline_dir_without_matplotlib_fails_before_running(monkeypatch, tmp_path, capsys):
    real = pipeline_bench.importlib.util.find_spec
    monkeypatch.setattr(pipeline_bench.importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    err = _usage_error(pipeline_bench, ["--timeline-dir", str(tmp_path)], capsys)
    assert "matplotlib, which is not installed" in err


# ----- help -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_help_explains_every_flag(name):
    ap = ENTRY_POINTS[name].build_parser()
    text = ap.format_help()
    shown = [a for a in ap._actions if a.option_strings and a.help != argparse.SUPPRESS]
    hidden = [a for a in ap._actions if a.option_strings and a.help == argparse.SUPPRESS]
    assert len(shown) > 10 and not hidden
    for action in shown:
        assert action.help and len(action.help) > 10, action.option_strings
        for spelling in action.option_strings:
            assert spelling in text, spelling
    assert "(default: 3)" in text  # -n's default is shown

"""What a new user's first day tripped over (issue 44, item 5): the DTensor
Redistributor where the docs say, ``reshard plan --summary`` and a reader that goes
away (``| head``), ``reshard serve --help`` with defaults, lowercase specs."""

from __future__ import annotations

import subprocess
import sys

from reshard import ShardingSpec
from reshard import cli as reshard_cli

PLAN = ["plan", "--shape", "256,256", "--src-mesh", "4x8", "--src-spec", "S01R",
        "--dst-mesh", "4x8@32", "--dst-spec", "RS10", "--hosts", "8x8"]


def test_the_redistributor_imports_from_the_adapter():
    import pytest

    pytest.importorskip("torch")
    from reshard.adapters.dtensor import Redistributor
    from reshard.adapters.dtensor_redistribute import Redistributor as Same

    assert Redistributor is Same


def test_plan_summary_prints_one_line(capsys):
    assert reshard_cli.main([*PLAN, "--summary"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "tasks" in out[0]
    assert reshard_cli.main(PLAN) == 0
    assert len(capsys.readouterr().out.splitlines()) > 100  # every task


def test_plan_into_a_reader_that_goes_away_ends_quietly():
    head = subprocess.run(
        f"{sys.executable} -m reshard.cli {' '.join(PLAN)} | head -2", check=False, shell=True,
        capture_output=True, text=True, timeout=120)
    assert len(head.stdout.splitlines()) == 2
    assert "BrokenPipeError" not in head.stderr and "Traceback" not in head.stderr


def test_serve_help_shows_defaults(capsys):
    import pytest

    with pytest.raises(SystemExit):
        reshard_cli.main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # as one line: help wraps
    assert "(default: 127.0.0.1)" in out and "(default: 50051)" in out
    assert "(default: 16384)" in out  # --max-devices
    assert "(default: None)" not in out and "(default: False)" not in out


def test_lowercase_specs_are_the_uppercase_ones():
    assert ShardingSpec.parse("s0r+p1") == ShardingSpec.parse("S0R+P1")
    assert ShardingSpec.parse("rs01:nested") == ShardingSpec.parse("RS01:nested")

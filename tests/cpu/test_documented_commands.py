"""Commands the README documents, run as a user types them (a new process each)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import reshard

pytestmark = pytest.mark.cpu


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd="/")


@pytest.mark.timeout(180)
def test_the_mlp_example_runs_under_python_dash_m():
    """``python -m reshard.pipeline.examples.mlp``: its stage classes are imported by the
    workers by package name (under ``-m`` the module itself is ``__main__``)."""
    out = _run("-m", "reshard.pipeline.examples.mlp", "--steps", "1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK: worst difference" in out.stdout


@pytest.mark.timeout(60)
def test_every_cli_reports_its_version():
    for argv in (("-m", "reshard.cli", "--version"), ("-m", "reshard.microbench", "--version")):
        out = _run(*argv)
        assert out.returncode == 0 and reshard.__version__ in out.stdout, (argv, out)

"""Commands the README documents, run as a user types them (a new process each)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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


ROOT = Path(__file__).resolve().parents[2]
MAIN = re.compile(r'^if __name__ == "__main__":', re.MULTILINE)
PACKAGES = {"reshard": "reshard", "planner": "reshard.planner", "comm": "reshard.comm",
            "pipeline": "reshard.pipeline", "microbench": "reshard.microbench"}


def command_lines() -> list[tuple[str, ...]]:
    """Every command line of the repository: each module run as ``python -m`` (it has a
    ``__main__`` block or is a package's ``__main__.py``) and each example script."""
    out = []
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if path.name != "__main__.py" and not MAIN.search(text):
                continue
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__main__":
                parts = parts[:-1]
            out.append(("-m", ".".join((package, *parts))))
    out += [(str(p),) for p in sorted((ROOT / "examples").glob("*.py"))]
    return out


def test_the_command_lines_are_found():
    found = {c[-1] for c in command_lines()}
    assert {"reshard.cli", "reshard.microbench", "reshard.pipeline",
            "reshard.microbench.scaleout"} <= found and len(found) > 20


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", command_lines(), ids=lambda a: a[-1].rsplit("/", 1)[-1])
def test_every_command_line_reports_its_version(argv):
    out = _run(*argv, "--version", timeout=50)
    assert out.returncode == 0 and reshard.__version__ in out.stdout, (argv, out)

"""ruff (with import sorting and pyupgrade rules) and mypy are clean on the whole
package, as CI checks it. mypy runs on the package as it installs (the subpackages
staged inside reshard/), so cross-package types are resolved, not silently Any."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_ruff_clean():
    pytest.importorskip("ruff", reason="ruff is in the dev extra")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                          "--output-format", "concise", "."],
                         check=False, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_clean_on_the_installed_layout(tmp_path):
    pytest.importorskip("mypy", reason="mypy is in the dev extra")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "stage_package.py"),
                    str(tmp_path)], check=True, capture_output=True, timeout=120)
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                          str(ROOT / "pyproject.toml"), "--no-incremental",
                          "-p", "reshard"],
                         check=False, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "Success" in out.stdout

"""The user guide builds strictly (broken links, missing API objects and bad
docstrings fail), and its pictures are drawn from the code."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_docs_build_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra (mkdocs) is not installed")
    pytest.importorskip("mkdocstrings")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                          "-d", str(tmp_path / "site")],
                         check=False, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    reference = (tmp_path / "site" / "reference" / "index.html").read_text(encoding="utf-8")
    for name in ("DeviceMesh", "ShardingSpec", "plan_many", "Runtime", "ReshardError"):
        assert name in reference


def test_figures_are_drawn_from_the_code(tmp_path):
    pytest.importorskip("matplotlib")
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "figures.py"), str(tmp_path)],
                         check=False, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    for name in ("layouts.png", "plan-s0r-rs0.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000

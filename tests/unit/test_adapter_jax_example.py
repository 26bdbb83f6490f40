"""Example (c): examples/jax_two_stage.py runs as one command and matches the
single-device computation (skipped without jax)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jax_two_stage.py"


@pytest.mark.timeout(120)
def test_two_stage_jax_example():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, str(EXAMPLE), "--microbatches", "2",
                          "--strategy", "allgather"],
                         check=False, capture_output=True, text=True, timeout=110, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "OK"
    assert "S0S1@mesh(2, 2)[0..3] -> stage 2 RS0@mesh(4,)[4..7]" in lines[0]
    assert sum("activation on devices [4, 5, 6, 7]" in ln for ln in lines) == 2

"""The torch examples, each run as the one command a user types (8 gloo processes).

Each example checks its own results against an independent computation (one-process
math; DTensor's own placement of the full weights) and fails with a non-zero exit
otherwise; here we run it, bounded in time, and read its summary line.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cpu
pytest.importorskip("torch")

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *args: str, timeout: float) -> str:
    """``python examples/<name> args`` in its own process group, killed whole on timeout;
    its output (the test fails on a non-zero exit)."""
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / name), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{name} did not finish within {timeout:g}s:\n{out[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{out[-3000:]}"
    return out


@pytest.mark.timeout(200)
def test_dtensor_pipeline_example():
    out = run_example("dtensor_pipeline.py", "--microbatches", "3", timeout=180)
    assert "outputs equal the one-process result" in out, out[-2000:]
    assert "microbatch 3/3: exact" in out  # a heartbeat while it runs
    # and a word at each long wait: the processes joined, the teardown, the total
    assert "all 8 processes joined" in out and "shutting the 8 processes down" in out
    assert "done in " in out


@pytest.mark.timeout(200)
def test_rl_weight_sync_example_to_an_fp8_engine():
    # bf16 trainer -> fp8 engine: matrices fp8 with block scales, biases and norms bf16,
    # one plan, each shard and its scales against the reference cast (issue 44)
    out = run_example("rl_weight_sync.py", "--steps", "2", "--dim", "64", "--fp8",
                      timeout=180)
    assert "fp8 matrices with block scales, bf16 biases and norms, every shard equal to " \
        "the full weights' reference cast" in out, out[-2000:]


@pytest.mark.timeout(200)
def test_rl_weight_sync_example():
    out = run_example("rl_weight_sync.py", "--steps", "2", "--dim", "64", timeout=180)
    assert "every shard equal to the full weights'" in out, out[-2000:]
    assert "sync 2/2:" in out  # a heartbeat while it runs
    assert "all 8 processes joined" in out and "shutting the 8 processes down" in out
    assert "done in " in out

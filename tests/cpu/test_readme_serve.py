"""The README's "Serve it" snippet pasted into a file and run as a script, with a
request large enough for the server's worker processes (a 128-device all-to-all, the
first-day report's): it works as written (the server's workers import the script as
their main module, so the snippet needs its ``__main__`` guard)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cpu

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"

BIG = """
a2a = reshard.Cluster.preset("dgx-h100", 16)
x = reshard.Layout(reshard.DeviceMesh((16, 8)), "S01R")
y = reshard.Layout(reshard.DeviceMesh((16, 8)), "RS10")
big, _ = c.estimate((8 * 128, 4096), "bfloat16", x, y, cluster=a2a, timeout=120)
print("BIG", big)
"""


@pytest.mark.timeout(300)
def test_the_serve_snippet_runs_as_a_script_with_a_request_for_the_workers(tmp_path):
    text = README.read_text(encoding="utf-8")
    block = re.search(r"\*\*Serve it\.\*\*.*?```python\n(.*?)```", text, re.DOTALL)
    assert block, "README lost its Serve it snippet"
    code = block.group(1).rstrip("\n")
    indent = re.match(r"\s*", code.splitlines()[-1]).group(0)  # the last line's block
    script = code + "\n" + "".join(f"{indent}{line}\n" for line in BIG.strip().splitlines())
    path = tmp_path / "serve_it.py"
    path.write_text(script)
    out = subprocess.run([sys.executable, str(path)], check=False, capture_output=True, text=True,
                         timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "BIG " in out.stdout and "Traceback" not in out.stderr

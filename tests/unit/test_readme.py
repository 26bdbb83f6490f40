"""The user guide's examples (docs/guide.md, the README's tour in full) run as written
and give what they say."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guide.md"


def _run_block(heading: str) -> dict:
    """Execute the first python block under the README heading ``heading``; its names."""
    text = README.read_text(encoding="utf-8")
    code = re.search(rf"## {heading}[^\n]*\n.*?```python\n(.*?)```", text, re.DOTALL)
    assert code, f"README lost its example under '## {heading}'"
    scope: dict = {}
    exec(compile(code.group(1), "README.md", "exec"), scope)  # noqa: S102
    return scope


def test_readme_api_example_runs():
    scope = _run_block("API in a few lines")
    p, y, rt = scope["p"], scope["y"], scope["rt"]
    assert p.estimate() >= p.lower_bound() > 0
    assert y.layout == scope["dst"] and rt.closed


def test_readme_dtype_example_runs():
    """The dtype section's example: bf16 bit for bit, block-fp8 equal to the reference."""
    import numpy as np

    from reshard.casting import reference_cast
    from reshard.dtypes import Cast, ScaleMode

    scope = _run_block("Dtypes")
    weights, values, scales = scope["weights"], scope["values"], scope["scales"]
    want, want_scales = reference_cast(weights, Cast("float8_e4m3fn", ScaleMode.BLOCK128))
    assert values.tobytes() == want.tobytes() and np.array_equal(scales, want_scales)
    assert scope["p"].lower_bound() > 0 and scope["y"].dtype == "bfloat16"


def test_readme_service_example_runs_as_pasted():
    """The gRPC section's snippet is self-contained: a server, an estimate, a plan."""
    scope = _run_block("gRPC service")
    assert scope["seconds"] >= scope["bound"] > 0
    assert scope["p"].lower_bound() == scope["bound"] and scope["p"].tasks

"""The README's API example runs as written."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_api_example_runs():
    text = README.read_text(encoding="utf-8")
    code = re.search(r"## API in a few lines\n\n```python\n(.*?)```", text, re.DOTALL)
    assert code, "README lost its API example"
    scope: dict = {}
    exec(compile(code.group(1), "README.md", "exec"), scope)  # noqa: S102
    p, y, rt = scope["p"], scope["y"], scope["rt"]
    assert p.estimate() >= p.lower_bound() > 0
    assert y.layout == scope["dst"] and rt._closed

"""Every Python snippet and every command of README.md and docs/*.md runs as written.

A ```python block runs alone in a fresh interpreter, unless the line before it says
``<!-- continues: NAME -->`` (it runs after the block named ``NAME`` by a
``<!-- snippet: NAME -->`` line, in one interpreter) or ``<!-- not run: WHY -->`` (it
needs what CI lacks: a GPU, a Ray cluster of several machines; WHY says which). A
```bash block's lines run in a shell from the repository root, but the set-up
commands (``pip install``: CI itself runs them) and those marked ``<!-- not run -->``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:^<!-- (?P<mark>[^>]*) -->\n)?^```(?P<lang>python|bash)\n(?P<body>.*?)^```$",
                   re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    lang: str
    body: str
    mark: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def snippets() -> list[Snippet]:
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start("body"))
            out.append(Snippet(page.relative_to(ROOT).as_posix(), line, m["lang"], m["body"],
                               (m["mark"] or "").strip()))
    return out


ALL = snippets()


def _program(s: Snippet) -> str:
    """The code to run for ``s``: its continuations' chain, then itself."""
    chain = [s.body]
    mark = s.mark
    while mark.startswith("continues:"):
        name = mark.split(":", 1)[1].strip()
        named = [x for x in ALL if x.mark == f"snippet: {name}" and x.page == s.page]
        assert len(named) == 1, f"{s.id}: continues {name!r}, which names {len(named)} blocks"
        chain.insert(0, named[0].body)
        mark = named[0].mark
    return "\n".join(chain)


def test_the_pages_have_snippets_and_marks_say_why():
    assert sum(s.lang == "python" for s in ALL) >= 15
    for s in ALL:
        if s.mark.startswith("not run"):
            assert len(s.mark.split(":", 1)[-1].strip()) > 10, f"{s.id}: say why it is not run"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("snippet", [s for s in ALL if s.lang == "python"], ids=lambda s: s.id)
def test_python_snippet_runs(snippet, tmp_path):
    if snippet.mark.startswith("not run"):
        pytest.skip(snippet.mark)
    out = subprocess.run([sys.executable, "-c", _program(snippet)], capture_output=True,
                         text=True, timeout=280, cwd=tmp_path, check=False)
    assert out.returncode == 0, f"{snippet.id}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"


def _commands() -> list[tuple[Snippet, str]]:
    out = []
    for s in ALL:
        if s.lang != "bash" or s.mark.startswith("not run"):
            continue
        for line in s.body.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "pip install" not in line:
                out.append((s, line))
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("snippet,command", _commands(), ids=lambda x: getattr(x, "id", ""))
def test_documented_command_runs(snippet, command):
    out = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=280,
                         cwd=ROOT, check=False, executable="/bin/bash")
    assert out.returncode == 0, f"{snippet.id}: {command}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"

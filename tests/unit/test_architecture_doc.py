"""docs/architecture.md's "Where a new thing goes" table names files that exist: a
newcomer who follows a row finds the file it names (placeholders such as ``<name>``
stand for a new file: their folder must exist)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def _rows() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    table = text.split("## Where a new thing goes", 1)[1]
    return [line for line in table.splitlines() if line.startswith("| ") and "---" not in line
            and not line.startswith("| a new")]


def _paths(row: str) -> list[str]:
    """The backticked names in ``row`` that look like files or folders."""
    return [p for p in re.findall(r"`([^`]+)`", row)
            if "/" in p and " " not in p and not p.startswith("python")]


def test_the_table_has_a_row_for_each_kind_of_new_thing():
    kinds = {row.split("|")[1].strip() for row in _rows()}
    for kind in ("backend", "strategy", "dtype", "pipeline schedule", "adapter", "benchmark",
                 "planning step (a strategy's candidate)", "fp8 scale format", "service call",
                 "task kind", "cost-model term", "launcher", "worker call"):
        assert kind in kinds, f"no row for a new {kind}"


def test_every_path_in_the_table_exists():
    missing = []
    for row in _rows():
        paths = _paths(row)
        assert paths, f"a row names no file: {row}"
        for p in paths:
            where = ROOT / (p.split("<", 1)[0] if "<" in p else p)
            if "<" in p:
                where = where if where.is_dir() else where.parent
            if not where.exists():
                missing.append(p)
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def _names_to_copy(row: str) -> list[str]:
    """The backticked names in ``row``'s last column ("copy") that are not paths: the
    example a newcomer is told to copy (``_hop`` there, ``calls.Drop``...)."""
    copy = row.strip().strip("|").split("|")[-1]
    return [n for n in re.findall(r"`([^`]+)`", copy) if n not in _paths(row)]


def _defines(text: str, name: str) -> bool:
    """Whether ``text`` defines ``name`` (its last dotted part: a ``def``, ``class``,
    assignment, protobuf ``rpc`` or ``message``, a quoted key), or holds it literally
    (a TOML table such as ``["dgx-h100"]``; ``<...>`` placeholders stand for anything)."""
    if re.fullmatch(r"[A-Za-z_][\w.]*", name):
        last = re.escape(name.rsplit(".", 1)[-1])
        return bool(re.search(
            rf"^\s*((async\s+)?def|class|rpc|message)\s+{last}\b|^\s*{last}\s*[:=]|"
            rf"[\"']{last}[\"']", text, re.MULTILINE))
    parts = [re.escape(p) for p in re.split(r"<[^>]*>", name)]
    return bool(re.search(r"[\w-]+".join(parts), text))


def _files_of(row: str) -> list[Path]:
    out = []
    for p in _paths(row):
        where = ROOT / p.split("<", 1)[0]
        if where.is_file():
            out.append(where)
    return out


def test_every_name_the_table_says_to_copy_is_where_it_says():
    missing = []
    for row in _rows():
        texts = [f.read_text(encoding="utf-8") for f in _files_of(row)]
        for name in _names_to_copy(row):
            if not any(_defines(t, name) for t in texts):
                missing.append(f"{name} (in {[str(f.relative_to(ROOT)) for f in _files_of(row)]})")
    assert not missing, f"docs/architecture.md tells a newcomer to copy names its files lack: {missing}"


def test_the_name_check_finds_what_it_looks_for():
    row = "| thing | `comm/calls.py` | `calls.Drop` and `nothing_here` there |"
    assert _names_to_copy(row) == ["calls.Drop", "nothing_here"]
    text = (ROOT / "comm" / "calls.py").read_text(encoding="utf-8")
    assert _defines(text, "calls.Drop") and not _defines(text, "nothing_here")
    assert _defines('[presets."dgx-h100"]\n["dgx-h100"]\nx = 1\n', '["dgx-h100"]')
    assert _defines("DTYPES = {\"float8_e5m2\": 1}", "float8_e5m2")
    assert not _defines("def _hopper(): pass", "_hop")
    assert _defines("    ('trees:2/4', 1)", "trees:<hosts>/<intra>")

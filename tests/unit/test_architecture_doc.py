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
                 "planning step (a strategy's candidate)", "fp8 scale format", "service call"):
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

"""The index of benchmarks (``reshard.microbench.index``): every module of microbench/
with a ``main(argv)`` is listed once, under its own name, with one line of what it
measures, and nothing else is; ``python -m reshard.microbench.index`` prints them all."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from reshard.microbench import index


def _entry_points() -> set[str]:
    """The modules of microbench/ (not its subpackages) that define ``main``."""
    spec = importlib.util.find_spec("reshard.microbench")
    assert spec is not None and spec.origin is not None
    found = set()
    for path in Path(spec.origin).parent.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if path.stem not in ("__main__", "index") and any(
                isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
            found.add(f"reshard.microbench.{path.stem}")
    return found


def test_the_index_lists_every_benchmark_once_and_nothing_else():
    listed = [b.module for b in index.BENCHMARKS]
    assert len(listed) == len(set(listed)), "a module listed twice"
    assert set(listed) == _entry_points()
    assert len(listed) >= 20  # the scan found the package, not a stub of it
    names = [b.name for b in index.BENCHMARKS]
    assert len(names) == len(set(names))
    for b in index.BENCHMARKS:
        assert b.name == ("reshard-bench" if b.module.endswith(".cli")
                          else b.module.rpartition(".")[2]), b
        assert b.summary and "\n" not in b.summary and len(b.summary) <= 80, b
        assert b.summary == b.summary.strip() and not b.summary.endswith("."), b


def test_the_index_prints_each_benchmark_with_its_command(capsys):
    assert index.main([]) == 0
    out = capsys.readouterr().out
    for b in index.BENCHMARKS:
        line = next(row for row in out.splitlines() if row.startswith(b.name + " "))
        assert f"python -m {b.module}" in line and b.summary in line

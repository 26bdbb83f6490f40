"""The size limits of the house rules (one concept per file): no file over
:data:`FILE_LINES` lines, no function over :data:`FUNCTION_LINES`, no class over
:data:`CLASS_LINES`, and the classes named in :data:`OWN_LIMITS` within theirs. What is
over a limit on purpose is in :data:`ALLOWED` with its reason; an entry that is no longer
over its limit fails too, so the list only shrinks.

Lines are counted as a reader meets them: every line of a file; a function or class from
its ``def`` / ``class`` line to its last, docstring, comments and blank lines included.
Checked: the package's sources (``reshard/``, ``planner/``, ``comm/``, ``pipeline/``,
``microbench/``), the tests, ``scripts/`` and ``examples/``; generated protobuf stubs
excepted."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

ROOT = Path(__file__).resolve().parents[2]

FILE_LINES = 600
FUNCTION_LINES = 60
CLASS_LINES = 400

OWN_LIMITS: Mapping[str, int] = MappingProxyType({
    # the step loop and the sources only: each task kind's prepare / issue / unpack is
    # a class of its own (comm/engine/)
    "comm/engine/execution.py::Execution": 200,
})
"""Classes held to a tighter limit than :data:`CLASS_LINES`, by ``path::qualname``."""

ALLOWED: Mapping[str, str] = MappingProxyType({
})
"""What may exceed its limit, by path (a file) or ``path::qualname`` (a function or
class), with the reason."""

SOURCES = ("reshard", "planner", "comm", "pipeline", "microbench", "tests", "scripts",
           "examples")


def _files() -> Iterator[Path]:
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts and "_pb2" not in path.name:
                yield path


def _defs(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """``(qualname, node)`` of every function and class, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            yield name, node
            yield from _defs(node, f"{name}.")
        else:
            yield from _defs(node, prefix)


def over_limits(path: Path, text: str) -> dict[str, tuple[int, int]]:
    """``{key: (lines, limit)}`` of what in ``text`` (the file at ``path``, relative to
    the repository) exceeds its limit; keys as in :data:`ALLOWED`."""
    where = path.as_posix()
    out = {}
    lines = len(text.splitlines())
    if lines > FILE_LINES:
        out[where] = (lines, FILE_LINES)
    for name, node in _defs(ast.parse(text, where)):
        key = f"{where}::{name}"
        size = node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]
        limit = OWN_LIMITS.get(key, CLASS_LINES if isinstance(node, ast.ClassDef)
                               else FUNCTION_LINES)
        if size > limit:
            out[key] = (size, limit)
    return out


@functools.cache
def _measured() -> dict[str, tuple[int, int]]:
    found: dict[str, tuple[int, int]] = {}
    for path in _files():
        found.update(over_limits(path.relative_to(ROOT), path.read_text(encoding="utf-8")))
    return found


def test_nothing_exceeds_its_limit_unless_allowed_with_a_reason():
    bad = [f"{key}: {n} lines (limit {limit})" for key, (n, limit) in sorted(_measured().items())
           if key not in ALLOWED]
    assert not bad, ("over the size limits (split it, one concept per file / function; or "
                     "add it to ALLOWED with the reason):\n" + "\n".join(bad))


def test_every_allowance_is_still_needed_and_says_why():
    measured = _measured()
    stale = [key for key in ALLOWED if key not in measured]
    assert not stale, f"no longer over their limits: drop them from ALLOWED: {stale}"
    assert all(len(reason) > 20 for reason in ALLOWED.values())
    for key in OWN_LIMITS:
        path, _, name = key.partition("::")
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        assert name in dict(_defs(tree)), f"OWN_LIMITS names {key}, which does not exist"


def test_the_counter_finds_what_it_looks_for():
    body = "\n".join(f"        x{i} = {i}" for i in range(FUNCTION_LINES))
    text = f"class A:\n    def f(self):\n{body}\n\n\ndef g():\n    return 1\n"
    found = over_limits(Path("pkg/mod.py"), text)
    assert found == {"pkg/mod.py::A.f": (FUNCTION_LINES + 1, FUNCTION_LINES)}
    long = "\n" * FILE_LINES + "def h():\n    def inner():\n" + body
    found = over_limits(Path("pkg/long.py"), long)
    assert set(found) == {"pkg/long.py", "pkg/long.py::h", "pkg/long.py::h.inner"}
    methods = "\n".join(f"    def m{i}(self):\n        return {i}\n" for i in range(CLASS_LINES // 3 + 1))
    assert set(over_limits(Path("c.py"), f"class Big:\n{methods}")) == {"c.py::Big"}

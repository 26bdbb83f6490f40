"""setup.py's ``python_requires`` says the oldest Python the code runs on: the newest
standard-library name or syntax any installed module uses decides it (``tomllib`` and
``typing.Self`` are 3.11's), and every module parses under that version's grammar.

The names are a table of the standard library's additions by release (the "What's New"
pages); a name the code starts to use that is newer than the table's oldest entry must
join it, which the planted-source test below shows the reader finds."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from .test_layers import modules

ROOT = Path(__file__).resolve().parents[2]

Version = tuple[int, int]

ADDED: dict[Version, frozenset[str]] = {
    (3, 11): frozenset({
        "tomllib", "wsgiref.types", "typing.Self", "typing.LiteralString", "typing.Never",
        "typing.assert_never", "typing.assert_type", "typing.reveal_type", "typing.Required",
        "typing.NotRequired", "typing.dataclass_transform", "enum.StrEnum", "enum.verify",
        "enum.ReprEnum", "enum.member", "enum.nonmember", "enum.global_enum", "datetime.UTC",
        "asyncio.TaskGroup", "asyncio.timeout", "asyncio.Runner", "contextlib.chdir",
        "hashlib.file_digest", "operator.call", "builtins.ExceptionGroup",
        "builtins.BaseExceptionGroup", "logging.getLevelNamesMapping",
        "math.cbrt", "math.exp2", "inspect.markcoroutinefunction",
    }),
    (3, 12): frozenset({
        "typing.override", "typing.TypeAliasType", "itertools.batched",
        "collections.abc.Buffer", "calendar.Month", "calendar.Day", "math.sumprod",
        "os.path.splitroot", "pathlib.Path.walk",
    }),
    (3, 13): frozenset({
        "warnings.deprecated", "typing.TypeIs", "typing.ReadOnly", "typing.NoDefault",
        "copy.replace", "queue.ShutDown", "math.fma", "base64.z85encode",
    }),
}
"""Standard-library names by the release that added them (``builtins.X`` for a builtin)."""

OLDEST: Version = (3, 10)
"""Below the table: what needs nothing from it (``match``, ``X | Y`` unions, slots and
kw_only dataclasses are 3.10's)."""


def _names_used(tree: ast.AST) -> Iterator[str]:
    """Dotted standard-library names ``tree`` imports or reads: ``import a.b``,
    ``from a import b`` (``a.b``), ``a.b`` attribute reads of an imported module, bare
    builtins (``builtins.X``)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
                aliases[(a.asname or a.name).split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = [node.attr]
            inner: ast.expr = node.value
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in aliases:
                yield ".".join([aliases[inner.id], *reversed(parts)])
        elif isinstance(node, ast.Name):
            yield f"builtins.{node.id}"


def _syntax_needs(tree: ast.AST) -> Iterator[Version]:
    """Versions the grammar ``tree`` uses needs (``except*`` 3.11; ``type`` aliases and
    ``def f[T]()`` 3.12)."""
    for node in ast.walk(tree):
        if type(node).__name__ == "TryStar":
            yield (3, 11)
        elif type(node).__name__ == "TypeAlias" or getattr(node, "type_params", None):
            yield (3, 12)


def needs(source: str, where: str = "<source>") -> tuple[Version, list[str]]:
    """The oldest Python ``source`` runs on and, when above :data:`OLDEST`, why."""
    tree = ast.parse(source, where)
    found = [(v, name) for name in set(_names_used(tree))
             for v, names in ADDED.items() if name in names]
    found += [(v, "syntax") for v in _syntax_needs(tree)]
    best = max((v for v, _ in found), default=OLDEST)
    return best, sorted(f"{name} ({v[0]}.{v[1]})" for v, name in found if v == best)


def python_requires() -> Version:
    """setup.py's ``python_requires=">=X.Y"``."""
    text = (ROOT / "setup.py").read_text(encoding="utf-8")
    found = re.search(r'python_requires=">=(\d+)\.(\d+)"', text)
    assert found, "setup.py states no python_requires=\">=X.Y\""
    return int(found.group(1)), int(found.group(2))


def test_python_requires_is_what_the_code_needs():
    needed: dict[Version, list[str]] = {}
    for name, path in modules().items():
        version, why = needs(path.read_text(encoding="utf-8"), str(path))
        needed.setdefault(version, []).extend(f"{name}: {w}" for w in why)
    newest = max(needed)
    stated = python_requires()
    assert stated == newest, (
        f"setup.py's python_requires is >={stated[0]}.{stated[1]} but the code needs "
        f">={newest[0]}.{newest[1]} ({', '.join(sorted(needed[newest])[:5])}); state "
        f"python_requires=\">={newest[0]}.{newest[1]}\" (and the README's set-up line)")


def test_every_module_parses_under_the_oldest_python_it_claims():
    """No grammar newer than ``python_requires`` (``ast.parse``'s ``feature_version``)."""
    stated = python_requires()
    bad = []
    for name, path in modules().items():
        try:
            ast.parse(path.read_text(encoding="utf-8"), str(path), feature_version=stated)
        except SyntaxError as e:
            bad.append(f"{name}: {e}")
    assert not bad, f"modules Python {stated[0]}.{stated[1]} cannot parse: {bad}"


def test_the_reader_finds_what_it_looks_for():
    assert needs("import json\nx: int | None = None\n")[0] == OLDEST
    assert needs("import tomllib\n") == ((3, 11), ["tomllib (3.11)"])
    assert needs("from typing import Any, Self\n")[1] == ["typing.Self (3.11)"]
    assert needs("import typing as t\ndef f() -> 't.Self': ...\nt.Self\n")[0] == (3, 11)
    assert needs("import itertools\nitertools.batched([], 2)\n")[0] == (3, 12)
    assert needs("from itertools import batched\nimport tomllib\n")[1] == [
        "itertools.batched (3.12)"]
    assert needs("raise ExceptionGroup('x', [])\n")[0] == (3, 11)
    assert needs("try:\n    pass\nexcept* ValueError:\n    pass\n")[0] == (3, 11)
    if sys.version_info >= (3, 12):  # grammar this interpreter can parse
        assert needs("type Pair = tuple[int, int]\n")[0] == (3, 12)
        assert needs("def first[T](xs: list[T]) -> T:\n    return xs[0]\n")[0] == (3, 12)


def test_the_linters_target_the_same_python():
    """ruff and mypy check the code for the Python setup.py promises, not another."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    major, minor = python_requires()
    assert config["ruff"]["target-version"] == f"py{major}{minor}"
    assert config["mypy"]["python_version"] == f"{major}.{minor}"

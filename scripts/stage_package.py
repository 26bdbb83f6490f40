"""Lay the package out as it installs, for tools that read source files by package path.

setup.py installs the repository's top-level folders planner/, comm/, pipeline/ and
microbench/ as subpackages of ``reshard`` (``package_dir``). Tools that read source
files (mkdocstrings for the API reference, mypy) and do not follow the editable
install's import hook need ``reshard/`` with those folders inside it: this copies
them so (symbolic links would not do: the tools resolve them back to the real
folders). ``python scripts/stage_package.py [DEST]`` (default ``.docs-src``).

A package's ``_moved/`` folder holds the modules that answer old import paths (the
package lists it in its ``__path__``, which the tools do not follow): each is staged
at its old path too, as the names of the module it stands for, re-exported one by one,
so the tools resolve ``reshard.core.errors.PlanError`` to ``reshard.core.errors.PlanError``.
"""

from __future__ import annotations

import ast
import pathlib
import re
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUBPACKAGES = ("planner", "comm", "pipeline", "microbench")


def stage(dest: pathlib.Path) -> pathlib.Path:
    """Copy ``reshard/`` with the subpackages inside it to ``dest/reshard``; returns
    ``dest``."""
    pkg = dest / "reshard"
    if pkg.exists():
        shutil.rmtree(pkg)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "reshard", pkg, ignore=skip)
    for sub in SUBPACKAGES:
        shutil.copytree(ROOT / sub, pkg / sub, ignore=skip)
    for moved in sorted(pkg.rglob("_moved")):
        for alias in sorted(moved.glob("*.py")):
            if alias.stem != "__init__":
                (moved.parent / alias.name).write_text(_reexport(dest, alias.read_text()))
    return dest


def _reexport(dest: pathlib.Path, alias: str) -> str:
    """The module an alias stands for (its ``from P import M as _moved``), as a module
    that re-exports each of that module's top-level names explicitly."""
    found = re.search(r"^from ([\w.]+) import (\w+) as _moved$", alias, re.MULTILINE)
    if found is None:
        raise SystemExit(f"an alias in _moved/ names no 'from P import M as _moved': {alias[:200]}")
    target = f"{found.group(1)}.{found.group(2)}"
    path = dest.joinpath(*target.split("."))
    source = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text()
    lines = [f'"""Staged alias of :mod:`{target}`."""', ""]
    lines += [f"from {target} import {n} as {n}" for n in exported(source)]
    return "\n".join(lines) + "\n"


def exported(source: str) -> list[str]:
    """The names a module's source makes its own at the top level: functions, classes,
    assignments, explicit re-exports (``import x as x``), and what its ``__all__``
    lists (also what scripts/short_path_stubs.py's stubs re-export)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                names.update(ast.literal_eval(node.value))
        elif isinstance(node, ast.Import | ast.ImportFrom):  # explicit re-exports only
            names.update(a.asname for a in node.names if a.asname == a.name.rpartition(".")[2])
    return sorted(names - {"__all__"})


if __name__ == "__main__":
    print(stage(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".docs-src"))

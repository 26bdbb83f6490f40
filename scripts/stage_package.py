"""Lay the package out as it installs, for tools that read source files by package path.

setup.py installs the repository's top-level folders planner/, comm/, pipeline/ and
microbench/ as subpackages of ``reshard`` (``package_dir``). Tools that read source
files (mkdocstrings for the API reference, mypy) and do not follow the editable
install's import hook need ``reshard/`` with those folders inside it: this copies
them so (symbolic links would not do: the tools resolve them back to the real
folders). ``python scripts/stage_package.py [DEST]`` (default ``.docs-src``).
"""

from __future__ import annotations

import pathlib
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
    return dest


if __name__ == "__main__":
    print(stage(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".docs-src"))

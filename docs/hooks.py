"""mkdocs hook: stage the package as it installs, for the API reference.

setup.py installs the repository's top-level folders planner/, comm/, pipeline/ and
microbench/ as subpackages of ``reshard`` (``package_dir``); mkdocstrings reads source
files by package path, so the build first lays out ``reshard/`` with those folders
inside it, copied under ``.docs-src/`` (git-ignored; griffe resolves symbolic links
back to their real folders, so links would not do).
"""

from __future__ import annotations

import pathlib
import shutil
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
STAGE = ROOT / ".docs-src"
SUBPACKAGES = ("planner", "comm", "pipeline", "microbench")


def stage() -> pathlib.Path:
    """Build ``.docs-src/reshard``: reshard/ with the subpackages inside it."""
    pkg = STAGE / "reshard"
    if STAGE.exists():
        shutil.rmtree(STAGE)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "reshard", pkg, ignore=skip)
    for sub in SUBPACKAGES:
        shutil.copytree(ROOT / sub, pkg / sub, ignore=skip)
    return STAGE


def on_config(config: Any) -> Any:
    """Stage the sources before any page renders."""
    stage()
    return config

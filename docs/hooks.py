"""mkdocs hook: stage the package as it installs before the API reference renders
(see scripts/stage_package.py: mkdocstrings reads source files by package path)."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def on_startup(command: str, dirty: bool) -> None:
    """Stage the sources into ``.docs-src/`` (git-ignored) before the configuration is
    read: mkdocstrings keeps only search paths that exist when it starts."""
    spec = importlib.util.spec_from_file_location(
        "stage_package", ROOT / "scripts" / "stage_package.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.stage(ROOT / ".docs-src")

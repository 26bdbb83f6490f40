"""Attributes of a package imported only when first asked for (PEP 562's module
``__getattr__``): names whose modules pull in heavy dependencies (torch, grpc, the data
plane) stay out of the package's import."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` from the module ``homes`` maps it
    to, imported then; an AttributeError naming the package for any other name."""

    def attribute(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        import importlib

        return getattr(importlib.import_module(home), name)

    return attribute


__all__ = ["lazy_attributes"]

"""Docstrings as terminal help: the reStructuredText markup a module's docstring uses
(``literal``, :role:`target`, ``Example::``) rendered as plain text, so ``--help``
reads as prose."""

from __future__ import annotations

import re

_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``([^`]+?)``")
_BLOCK = re.compile(r"::$", re.MULTILINE)


def _short(target: str) -> str:
    """A role's target as a reader wants it: the last dotted part of ``~a.b.C``."""
    return target.rsplit(".", 1)[-1] if "." in target else target


def for_terminal(doc: str | None) -> str:
    """``doc`` with its reST markup rendered as plain text (roles by their short name,
    literals bare, ``Example::`` as ``Example:``)."""
    if not doc:
        return ""
    text = _ROLE.sub(lambda m: _short(m.group(1).strip()), doc)
    text = _LITERAL.sub(r"\1", text)
    text = _BLOCK.sub(":", text)
    return text.replace(" ::\n", ":\n")


__all__ = ["for_terminal"]

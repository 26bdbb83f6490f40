"""Value types for the command lines' integer flags (argparse ``type=``): each parses
one value or says what a valid one looks like. Shared by every command line, the
benchmarks' and the examples' alike."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return int_at_least(text, 1)


def natural_int(text: str) -> int:
    """An integer >= 0."""
    return int_at_least(text, 0)


def int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
    return value


__all__ = ["int_at_least", "natural_int", "positive_int"]

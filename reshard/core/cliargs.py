"""What every command line shares: value types for integer flags (argparse ``type=``;
each parses one value or says what a valid one looks like) and ``--version``. Used by
the benchmarks', the examples' and the tools' parsers alike."""

from __future__ import annotations

import argparse

from reshard.core.version import __version__


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


def add_version(ap: argparse.ArgumentParser) -> None:
    """``--version``: the program and reshard's version (every command line has it)."""
    ap.add_argument("--version", action="version", version=f"%(prog)s (reshard {__version__})",
                    help="print the version and exit")


__all__ = ["add_version", "int_at_least", "natural_int", "positive_int"]

"""Tables in the manner of nccl-tests: fixed-width columns with units, and JSON."""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence


def fmt(v: Any) -> str:
    """Format one cell."""
    if isinstance(v, float):
        if v != v:  # NaN
            return "n/a"
        if abs(v) >= 1e5 or (0 < abs(v) < 1e-2):
            return f"{v:.3e}"
        return f"{v:.3f}"
    return str(v)


def scaled(factor: float, spec: str) -> Callable[[Any], str]:
    """A cell format: the value times ``factor``, formatted with ``spec`` (e.g. bytes
    shown as MB with ``scaled(1e-6, ".1f")``)."""
    return lambda v: format(v * factor, spec)


def table(rows: Sequence[dict], columns: Sequence[tuple]) -> str:
    """Render rows; ``columns`` are ``(key, header)`` pairs, headers carry units, or
    ``(key, header, format)`` with a function from the value to its cell (see
    :func:`scaled`) in place of :func:`fmt`."""
    cells = [[c[1] for c in columns]] + [
        [(c[2] if len(c) > 2 else fmt)(r.get(c[0], "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(path: str, payload: dict) -> None:
    """Write a JSON report."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, default=str)

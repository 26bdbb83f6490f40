"""Text tables: the one renderer of every table reshard prints (the benchmarks, the
planner timing, ``python -m reshard.pipeline``): :class:`Column` names a column with
its unit and one number format, :class:`Shape` fixes widths up front (for tables
printed row by row), :func:`table` renders rows. The streaming and JSON output of the
benchmarks builds on it (:mod:`reshard.microbench.report`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Format = Callable[[Any], str]
Row = dict[str, Any]
"""A table's row: its cells by column key."""


def fmt(v: Any) -> str:
    """One cell with no column format: floats with 3 decimals, or 3 significant digits
    in exponent form when large or small; None as ``-``."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else format(v, _float_spec([v]))
    return str(v)


def _float_spec(values: Sequence[float]) -> str:
    big_or_small = any(abs(v) >= 1e5 or 0 < abs(v) < 1e-2 for v in values
                       if not math.isnan(v))
    return ".3e" if big_or_small else ".3f"


def scaled(factor: float, spec: str) -> Format:
    """A cell format: the value times ``factor``, formatted with ``spec`` (e.g. bytes
    shown as MB with ``scaled(1e-6, ".1f")``); None as ``-``."""
    return lambda v: "-" if v is None else format(v * factor, spec)


@dataclass(frozen=True)
class Column:
    """One column of a table.

    Attributes:
        key: the row key it shows.
        header: its header, with the unit (``"time(us)"``).
        cell: how a value becomes text: a format spec (``".1f"``), a function, or
            None: floats share one format chosen from the column's values (see
            :func:`fmt`), other values as ``str``.
        width: the least width (a streamed table's numbers, unknown up front).
        align: ``"<"`` or ``">"``; empty: the table's.
    """

    key: str
    header: str
    cell: str | Format | None = None
    width: int = 0
    align: str = ""

    @classmethod
    def of(cls, spec: Column | tuple[Any, ...]) -> Column:
        """A column from itself or a ``(key, header[, cell])`` tuple."""
        return spec if isinstance(spec, Column) else cls(*spec)

    def text(self, row: Row, float_spec: str | None = None) -> str:
        """The cell of ``row`` (``float_spec`` for floats of a column without a cell)."""
        v = row.get(self.key)
        if callable(self.cell):
            return self.cell(v)
        if v is None:
            return "-"
        if isinstance(v, float) and math.isnan(v):
            return "n/a"
        if self.cell:
            return format(v, self.cell) if isinstance(v, (int, float)) else str(v)
        if isinstance(v, float):
            return format(v, float_spec or _float_spec([v]))
        return str(v)


@dataclass(frozen=True)
class Shape:
    """A table's columns and their widths: renders the header and any row alike, so a
    table can be printed all at once (:func:`table`) or row by row (:class:`Stream`)."""

    columns: tuple[Column, ...]
    widths: tuple[int, ...]
    specs: tuple[str | None, ...]
    align: str = ">"
    rule: bool = True

    @classmethod
    def fit(cls, columns: Sequence[Column | tuple[Any, ...]], rows: Sequence[Row] = (),
            align: str = ">", rule: bool = True) -> Shape:
        """Widths that hold the headers and every cell of ``rows`` (for a stream: the
        rows known up front, e.g. each case's descriptive keys)."""
        cols = tuple(Column.of(c) for c in columns)
        specs = tuple(_float_spec([r[c.key] for r in rows if isinstance(r.get(c.key), float)])
                      if c.cell is None else None for c in cols)
        widths = tuple(max([len(c.header), c.width] + [len(c.text(r, s)) for r in rows])
                       for c, s in zip(cols, specs))
        return cls(cols, widths, specs, align, rule)

    def _join(self, cells: Sequence[str]) -> str:
        return "  ".join(format(text, f"{c.align or self.align}{w}")
                         for text, c, w in zip(cells, self.columns, self.widths)).rstrip()

    def header(self) -> list[str]:
        """The header line, and a rule under it."""
        lines = [self._join([c.header for c in self.columns])]
        if self.rule:
            lines.append(self._join(["-" * w for w in self.widths]))
        return lines

    def line(self, row: Row) -> str:
        """One row (a cell wider than its column pushes the rest to the right)."""
        return self._join([c.text(row, s) for c, s in zip(self.columns, self.specs)])


def table(rows: Sequence[Row], columns: Sequence[Column | tuple[Any, ...]], align: str = ">",
          rule: bool = True) -> str:
    """The whole table: header (and a rule under it), then one line per row.

    Args:
        rows: the rows, dicts keyed as the columns say.
        columns: :class:`Column` values or ``(key, header[, cell])`` tuples.
        align: ``">"`` (numbers, the default) or ``"<"``.
        rule: draw a line of dashes under the header.
    """
    shape = Shape.fit(columns, rows, align, rule)
    return "\n".join(shape.header() + [shape.line(r) for r in rows])


__all__ = ["Column", "Format", "Row", "Shape", "fmt", "scaled", "table"]

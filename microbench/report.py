"""Output of every benchmark: tables in the manner of nccl-tests, rows streamed as they
finish under a progress bar, and JSON.

* :class:`Column` and :func:`table`: the one text-table renderer (the benchmarks, the
  planner timing and ``python -m reshard.pipeline`` all use it): headers with units,
  one number format per column;
* :class:`Stream`: a table printed row by row as results arrive (widths fixed up
  front), with notes between rows and a :class:`Progress` bar on stderr that the rows
  never tear;
* :func:`write_json` and :func:`machine`: the JSON file and what it says about the
  machine.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Self, TextIO

Format = Callable[[Any], str]


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
    def of(cls, spec: Column | tuple) -> Column:
        """A column from itself or a ``(key, header[, cell])`` tuple."""
        return spec if isinstance(spec, Column) else cls(*spec)

    def text(self, row: dict, float_spec: str | None = None) -> str:
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
    def fit(cls, columns: Sequence[Column | tuple], rows: Sequence[dict] = (),
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

    def line(self, row: dict) -> str:
        """One row (a cell wider than its column pushes the rest to the right)."""
        return self._join([c.text(row, s) for c, s in zip(self.columns, self.specs)])


def table(rows: Sequence[dict], columns: Sequence[Column | tuple], align: str = ">",
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


class Progress:
    """A progress bar on stderr (tqdm) while stdout and stderr are both terminals;
    otherwise nothing. Lines printed through :meth:`write` go to stdout without
    tearing the bar. The bar is redrawn every ``tick`` seconds, so its clock runs
    through long steps too.

    Args:
        total: units of work (rows, or timed runs).
        enabled: False for ``--no-progress``.
        desc: the bar's label.
        tick: seconds between redraws.
    """

    def __init__(self, total: int, enabled: bool = True, desc: str = "",
                 tick: float = 1.0) -> None:
        self._bar: Any = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if not (enabled and total > 0 and sys.stdout.isatty() and sys.stderr.isatty()):
            return
        try:
            from tqdm import tqdm
        except ImportError:
            print("# no progress bar: tqdm is not installed (pip install tqdm); "
                  "--no-progress hides this line", file=sys.stderr)
            return
        self._bar = tqdm(total=total, desc=desc, unit="step", leave=False,
                         dynamic_ncols=True, file=sys.stderr)
        self._ticker = threading.Thread(target=self._tick, args=(tick,), daemon=True,
                                        name="reshard-progress")
        self._ticker.start()

    def _tick(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            bar = self._bar
            if bar is not None:
                bar.refresh()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, n: int = 1) -> None:
        """``n`` units done."""
        if self._bar is not None:
            self._bar.update(n)

    def describe(self, text: str) -> None:
        """What is being done now (the bar's label)."""
        if self._bar is not None:
            self._bar.set_description_str(text)

    def write(self, line: str, file: TextIO | None = None) -> None:
        """Print ``line`` (to stdout by default) now, above the bar."""
        out = file or sys.stdout
        if self._bar is not None:
            self._bar.write(line, file=out)
        else:
            print(line, file=out, flush=True)

    def close(self) -> None:
        """Stop the redraws and remove the bar."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Stream:
    """A table printed as its rows arrive: the header first, each row when it is done,
    notes (``# ...`` lines) between them; every row is kept for the summary and JSON.

    Args:
        shape: the columns and widths (:meth:`Shape.fit` on what is known up front).
        progress: the bar the lines are printed around.
        view: what a row shows (e.g. display-only keys added); the row itself is kept.
    """

    def __init__(self, shape: Shape, progress: Progress,
                 view: Callable[[dict], dict] | None = None) -> None:
        self.shape = shape
        self.progress = progress
        self.view = view or (lambda r: r)
        self.rows: list[dict] = []
        self._started = False

    def start(self) -> None:
        """Print the header (once; the first row does it if not done before)."""
        if not self._started:
            self._started = True
            for line in self.shape.header():
                self.progress.write(line)

    def row(self, row: dict) -> None:
        """Print and keep one row."""
        self.start()
        self.rows.append(row)
        self.progress.write(self.shape.line(self.view(row)))

    def note(self, text: str) -> None:
        """Print a note line between rows."""
        self.progress.write(text)


def write_json(path: str, payload: dict) -> None:
    """Write a JSON report (values JSON cannot hold, as their ``str``)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, default=str)
        f.write("\n")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """What a benchmark's JSON says about where it ran: platform, Python, CPUs and
    the versions of reshard and the libraries its backends use (None when absent)."""
    import reshard

    return {
        "platform": platform.platform(), "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "reshard": reshard.__version__,
        "numpy": _version("numpy"), "torch": _version("torch"),
        "cupy": _version("cupy-cuda12x") or _version("cupy-cuda13x") or _version("cupy"),
        "ray": _version("ray"),
    }

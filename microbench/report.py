"""Output of every benchmark: tables in the manner of nccl-tests, rows streamed as they
finish under a progress bar, and JSON.

* :class:`Column` and :func:`table` (from :mod:`reshard.tables`, the one text-table
  renderer): headers with units, one number format per column;
* :class:`Stream`: a table printed row by row as results arrive (widths fixed up
  front), with notes between rows and a :class:`Progress` bar on stderr that the rows
  never tear;
* :func:`write_json` and :func:`machine`: the JSON file and what it says about the
  machine; :func:`write_rows`: a run's ``-J/--json`` file (flags, machine, rows), and
  :func:`print_rows`: a run's table, that file and its exit status.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any, Self, TextIO

from reshard.microbench import flags
from reshard.tables import Column, Format, Shape, fmt, scaled, table  # noqa: F401


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


def write_rows(args: argparse.Namespace, rows: list[dict]) -> None:
    """With ``-J/--json`` given, write the run's JSON report: its flags, the machine and
    the rows (nothing otherwise)."""
    if args.json:
        write_json(args.json, {"args": flags.as_dict(args), "machine": machine(),
                               "rows": rows})


def print_rows(args: argparse.Namespace, rows: list[dict], columns: Sequence[Column],
               title: str | None = None) -> int:
    """Print ``title`` (a ``# ...`` line saying what ran) and the rows' table, write the
    ``-J/--json`` report (:func:`write_rows`) and return the exit status: 1 if any row
    counted wrong results (``"wrong"``), else 0."""
    if title is not None:
        print(title)
    print(table(rows, columns))
    write_rows(args, rows)
    return 1 if any(r["wrong"] for r in rows) else 0


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

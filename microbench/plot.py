"""``reshard-bench --plot PATH.png``: algorithm bandwidth per case and strategy, with
the lower bound (the bandwidth no plan can beat) over each case.

matplotlib is an optional extra (``pip install 'reshard[plot]'``); :func:`require`
says so before a benchmark starts, not after it ran. The figure is drawn without
pyplot (no global figure state, no display needed).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

from reshard.errors import MissingDependencyError, ReshardError
from reshard.microbench.flags import human_bytes

SUFFIXES = (".png", ".svg", ".pdf")


class PlotError(ReshardError):
    """A plot cannot be written as asked."""


def require(path: str) -> None:
    """Raise now if ``path`` cannot be plotted to: no matplotlib, or a file type
    other than :data:`SUFFIXES`."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise PlotError(f"--plot {path}: the file type comes from its suffix, which must be "
                        f"one of {', '.join(SUFFIXES)}; got {suffix or 'none'}, e.g. "
                        f"--plot bench.png")
    if importlib.util.find_spec("matplotlib") is None:
        raise MissingDependencyError(
            f"--plot {path} needs matplotlib, which is not installed: pip install "
            f"'reshard[plot]' (or pip install matplotlib), or leave out --plot")


def figure(rows: Sequence[dict], title: str = "") -> Any:
    """The bandwidth chart of ``rows`` (reshard-bench rows): per case (and size, when
    a case has several), one bar per strategy: measured algbw in run mode, the
    model's in sim mode; a dashed line at the bound's algbw; in run mode the model's
    algbw as a hollow marker on each bar. Returns a matplotlib ``Figure``."""
    from matplotlib.figure import Figure

    measured = any(r["measured_algbw_gbps"] is not None for r in rows)
    key = "measured_algbw_gbps" if measured else "model_algbw_gbps"
    groups = list(dict.fromkeys((r["case"], r["bytes"]) for r in rows))
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    sizes_of: dict[str, int] = {}
    for case, _ in groups:
        sizes_of[case] = sizes_of.get(case, 0) + 1
    labels = [f"{case}\n{human_bytes(n)}" if sizes_of[case] > 1 else case
              for case, n in groups]
    by = {(r["case"], r["bytes"], r["strategy"]): r for r in rows}

    fig = Figure(figsize=(max(6.0, 0.35 * len(groups) * max(2, len(strategies)) + 2), 4.8))
    ax = fig.subplots()
    width = 0.8 / max(1, len(strategies))
    for i, strategy in enumerate(strategies):
        offset = (i - (len(strategies) - 1) / 2) * width
        xs, hs, models = [], [], []
        for g, (case, n) in enumerate(groups):
            r = by.get((case, n, strategy))
            if r is not None and r[key] is not None:
                xs.append(g + offset)
                hs.append(r[key])
                models.append(r["model_algbw_gbps"])
        ax.bar(xs, hs, width, label=strategy)
        if measured:
            ax.plot(xs, models, "D", mfc="none", color="black", markersize=4,
                    label="model" if i == 0 else "_nolegend_")
    for g, (case, n) in enumerate(groups):
        bound = next((r["bound_algbw_gbps"] for r in rows
                      if (r["case"], r["bytes"]) == (case, n) and r["bound_algbw_gbps"]), None)
        if bound is not None:
            ax.hlines(bound, g - 0.45, g + 0.45, colors="black", linestyles="dashed",
                      label="lower bound" if g == 0 else "_nolegend_")
    ax.set_xticks(range(len(groups)), labels, rotation=30 if len(groups) > 8 else 0,
                  ha="right" if len(groups) > 8 else "center", fontsize=8)
    ax.set_xlabel("case")
    ax.set_ylabel(("measured" if measured else "model") + " algbw (GB/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot(rows: Sequence[dict], path: str, title: str = "") -> None:
    """Write :func:`figure` of ``rows`` to ``path`` (its suffix picks the format)."""
    require(path)
    if not rows:
        raise PlotError(f"--plot {path}: no rows to plot (every case was refused)")
    figure(rows, title).savefig(path, dpi=120)

"""Draw the user guide's pictures of layouts and plans (docs/img/*.png).

Run ``python docs/figures.py [OUT_DIR]`` (matplotlib: the ``plot`` extra). Every
picture is computed from reshard's own layouts and plans, so it shows what the code
does.
"""

from __future__ import annotations

import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import itertools

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

import reshard
from reshard import Cluster, DeviceMesh, Layout, ShardingSpec

COLORS = plt.get_cmap("tab20").colors


def _draw_layout(ax, layout: Layout, shape: tuple[int, int], title: str) -> None:
    """One 2-d tensor as a grid; each device's box filled in its colour and labelled.
    Replicas (several devices on one box) are listed together."""
    boxes: dict[tuple, list[int]] = {}
    for dev, box in layout.index_map(shape).items():
        key = tuple((s.start, s.stop) for s in box)
        boxes.setdefault(key, []).append(dev)
    for ((r0, r1), (c0, c1)), devs in boxes.items():
        if r1 <= r0 or c1 <= c0:
            continue
        ax.add_patch(Rectangle((c0, r0), c1 - c0, r1 - r0, facecolor=COLORS[devs[0] % 20],
                               edgecolor="black", linewidth=1.2))
        ax.text((c0 + c1) / 2, (r0 + r1) / 2, ",".join(f"d{d}" for d in sorted(devs)),
                ha="center", va="center", fontsize=8)
    ax.set_xlim(0, shape[1])
    ax.set_ylim(shape[0], 0)
    ax.set_aspect("equal")
    ax.set_xticks(range(shape[1] + 1))
    ax.set_yticks(range(shape[0] + 1))
    ax.tick_params(labelsize=6)
    ax.set_title(title, fontsize=9)


def layouts(out: pathlib.Path) -> pathlib.Path:
    """Specs on a (2, 2) mesh of an (4, 6) tensor, and the two split rules on an uneven
    dim (DTensor's nested rule vs the flat rule of the spec text)."""
    mesh = DeviceMesh((2, 2))
    cases = [("S0R", (4, 6)), ("RS1", (4, 6)), ("S0S1", (4, 6)), ("S01R", (4, 6)),
             ("RS01", (2, 5)), ("RS01:nested", (2, 5))]
    fig, axes = plt.subplots(2, 3, figsize=(10, 5.5))
    for ax, (text, shape) in zip(axes.flat, cases):
        spec = ShardingSpec.parse(text)
        _draw_layout(ax, Layout(mesh, spec), shape, f"{text} on mesh (2, 2), shape {shape}")
    fig.suptitle("Which box of the tensor each device holds (Layout.index_map)")
    fig.tight_layout()
    path = out / "layouts.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plan_picture(out: pathlib.Path) -> pathlib.Path:
    """The broadcast plan of the paper's S0R -> RS0 transpose between two (2, 2) meshes
    on four 2-device hosts: source and destination layouts, and every task as an arrow
    from its root to its receivers, one panel per step."""
    cluster = Cluster.regular(num_hosts=4, devices_per_host=2)
    src = Layout(DeviceMesh((2, 2), devices=range(4)), "S0R")
    dst = Layout(DeviceMesh((2, 2), devices=range(4, 8)), "RS0")
    shape = (4, 4)
    p = reshard.plan(shape, "float32", src, dst, cluster=cluster, strategy="broadcast")
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.8),
                             gridspec_kw={"width_ratios": [1, 1, 1.6]})
    _draw_layout(axes[0], src, shape, "source S0R on devices 0-3")
    _draw_layout(axes[1], dst, shape, "destination RS0 on devices 4-7")
    ax = axes[2]
    hosts = cluster.hosts
    pos = {d: (h, i) for h, devs in enumerate(hosts) for i, d in enumerate(devs)}
    for h, devs in enumerate(hosts):
        ax.add_patch(Rectangle((h - 0.35, -0.4), 0.7, len(devs) - 0.2, fill=False,
                               linestyle="--", edgecolor="grey"))
        ax.text(h, len(devs) - 0.45, f"host {h}", ha="center", fontsize=8)
        for d in devs:
            ax.plot(*pos[d], "o", color=COLORS[d % 20], markersize=14)
            ax.text(*pos[d], f"d{d}", ha="center", va="center", fontsize=7)
    for n, t in enumerate(p.tasks):
        chain = (t.root, *t.receivers)
        for a, b in itertools.pairwise(chain):
            (x0, y0), (x1, y1) = pos[a], pos[b]
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops={
                "arrowstyle": "->", "color": COLORS[(2 * n) % 20], "lw": 1.5,
                "connectionstyle": f"arc3,rad={0.15 + 0.05 * (n % 3)}"})
    ax.set_xlim(-0.6, len(hosts) - 0.4)
    ax.set_ylim(-0.6, max(len(h) for h in hosts))
    ax.axis("off")
    ax.set_title(f"broadcast plan: {len(p.tasks)} chains, model {p.estimate() * 1e6:.0f} us, "
                 f"bound {p.lower_bound() * 1e6:.0f} us", fontsize=9)
    fig.tight_layout()
    path = out / "plan-s0r-rs0.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = pathlib.Path(args[0]) if args else pathlib.Path(__file__).parent / "img"
    out.mkdir(parents=True, exist_ok=True)
    for path in (layouts(out), plan_picture(out)):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

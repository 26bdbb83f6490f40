"""Which stage options can lie on some choice within the bound, known before any is built.

The one-chunk stage DP (:mod:`reshard.search.stagedp`) walks positions (next layer,
next device) from (0, 0) to (L, D); a stage option of layers ``i..j`` on a submesh of
``n`` devices at device ``d`` goes from (i, d) to (j + 1, d + n). Most options the
search used to build lie on no path (a 96-layer GPT on 8 x 8 H100s: 144,127 built, 79
on some path): a stage's inner time must stay within the cap (the bound over ``B - 1``
microbatches) and every device must be used, so few cuts tile the cluster.

A stage's inner time is at least its layers' least compute on its shape (moves cost
nothing or more), and its bytes per device at least their least ``memory +
activations`` (one microbatch in flight at least): per shape and first layer the
farthest last layer within both (:func:`far`). Over those lower bounds the positions
reachable from the start (:attr:`Reach.ahead`) and those that reach the end
(:attr:`Reach.behind`) are found in one pass each; an option lies on a path of options
within the cap only if its start is reachable and its end reaches the end, so building
only those changes no answer (every option the DP keeps is among them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from reshard.cluster import Cluster
from reshard.search.model import (
    Budget,
    Candidate,
    Layer,
    Shape,
    checked_already,
    devices,
    placements,
)


def far(layers: Sequence[Layer], shape: Shape, limit: float, cap: float) -> list[int]:
    """Per first layer ``i``, the last layer a stage on ``shape`` from ``i`` may reach
    within ``cap`` seconds and ``limit`` bytes by the lower bounds (module docstring);
    ``i - 1`` where none."""
    n = len(layers)
    least = []
    for layer in layers:
        cands = layer.candidates.get(shape, ())
        least.append((min((c.compute for c in cands), default=math.inf),
                      min((c.memory + c.activations for c in cands), default=math.inf)))
    out = []
    for i in range(n):
        j, t, m = i - 1, 0.0, 0.0
        while j + 1 < n:
            t, m = t + least[j + 1][0], m + least[j + 1][1]
            if t > cap or m > limit:
                break
            j += 1
        out.append(j)
    return out


@dataclass(frozen=True)
class Reach:
    """The positions on some path of stages within the lower bounds.

    Attributes:
        ahead: ``ahead[d][i]``: (layer ``i``, device ``d``) is reachable from (0, 0).
        behind: ``behind[d][i]``: (L, D) is reachable from (layer ``i``, device ``d``).
        far: per shape, :func:`far`.
    """

    ahead: list[list[bool]]
    behind: list[list[bool]]
    far: dict[Shape, list[int]]

    def lasts(self, shape: Shape, first: int, device: int) -> list[int]:
        """The last layers a stage of ``shape`` from layer ``first`` at ``device`` may
        have on some path (none where its start is unreachable)."""
        if not self.ahead[device][first]:
            return []
        end = device + shape[0] * shape[1]
        row = self.behind[end]
        return [j for j in range(first, self.far[shape][first] + 1) if row[j + 1]]


def reach(layers: Sequence[Layer], cluster: Cluster, shapes: Sequence[Shape], limit: float,
          cap: float, budget: Budget | None = None) -> Reach:
    """The positions of the one-chunk DP on some path within the lower bounds (module
    docstring), for stages of ``shapes`` (``budget`` checked at every device)."""
    budget = Budget(None) if budget is None else budget
    n, total = len(layers), devices(cluster)
    reach_far = {s: far(layers, s, limit, cap) for s in shapes}
    at = [[s for s in shapes if placements(cluster, s, d) is not None] for d in range(total)]
    behind = [[False] * (n + 1) for _ in range(total + 1)]
    behind[total][n] = True
    counts: dict[int, list[int]] = {total: _prefix(behind[total])}
    for d in range(total - 1, -1, -1):
        budget.check("finding the stages that can lie on a path (device {} of {})", d, total)
        row = behind[d]
        for s in at[d]:
            cnt, f = counts[d + s[0] * s[1]], reach_far[s]
            for i in range(n):
                if f[i] >= i and cnt[f[i] + 2] > cnt[i + 1]:
                    row[i] = True
        counts[d] = _prefix(row)
    diff = [[0] * (n + 2) for _ in range(total + 1)]
    diff[0][0], diff[0][1] = 1, -1
    ahead = []
    for d in range(total + 1):
        budget.check("finding the stages that can lie on a path (device {} of {})", d, total)
        row, run = [], 0
        for i in range(n + 1):
            run += diff[d][i]
            row.append(run > 0)
        ahead.append(row)
        for s in at[d] if d < total else ():
            e, f = d + s[0] * s[1], reach_far[s]
            for i in range(n):
                if row[i] and f[i] >= i:
                    diff[e][i + 1] += 1
                    diff[e][f[i] + 2] -= 1
    return Reach(ahead, behind, reach_far)


def block_shapes(layers: Sequence[Layer], size: int, cluster: Cluster, limit: float,
                 cap: float, budget: Budget | None = None) -> set[Shape]:
    """The submesh shapes some stage option over blocks of ``size`` layers
    (:mod:`reshard.search.blocks`) may lie on a path with: each block's least compute
    and bytes per shape bound its block candidates' from below, so a shape none of whose
    floors reaches a path holds no block candidate the DP keeps, and its blocks (and
    their moves) need not be built."""
    floors: list[Layer] = []
    for a in range(0, len(layers), size):
        part = layers[a:a + size]
        shared = set.intersection(*(set(layer.candidates) for layer in part))
        cands = {}
        for shape in shared:
            if all(layer.candidates[shape] for layer in part):
                # each bound its own least: the fastest candidate need not be the lightest
                cands[shape] = (checked_already(
                    Candidate, name="floor", input="", output="", grads=0, activations=0,
                    compute=sum(min(c.compute for c in layer.candidates[shape])
                                for layer in part),
                    memory=sum(min(c.memory + c.activations for c in layer.candidates[shape])
                               for layer in part)),)
        floors.append(checked_already(Layer, name=part[0].name, output_shape=(),
                                      dtype=part[-1].dtype, candidates=cands))
    shapes = sorted({s for layer in floors for s in layer.candidates})
    r = reach(floors, cluster, shapes, limit, cap, budget)
    total = devices(cluster)
    return {s for s in shapes for d in range(total) if placements(cluster, s, d) is not None
            for i in range(len(floors)) if r.lasts(s, i, d)}


def _prefix(row: Sequence[bool]) -> list[int]:
    """``out[k]``: how many of ``row[:k]`` are true."""
    out = [0]
    for x in row:
        out.append(out[-1] + x)
    return out


__all__ = ["Reach", "block_shapes", "far", "reach"]

"""The planner's own wall time on large inputs.

(a) a 128-device to 128-device all-to-all: S01 on a (16, 8) mesh to S10 on another
(16, 8) mesh; (b) 1,000 tensors of mixed layouts planned together with plan_many.
"""

from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

import numpy as np

import reshard
from reshard import Cluster, DeviceMesh, Layout

SPECS = ("S0RR", "RRR", "RS0R", "RS01R", "S1RR", "RRS0", "S01RR", "S1S0R", "RS10R")


T = TypeVar("T")


def _best_of(fn: Callable[[], T], repeat: int) -> tuple[float, T]:
    best = float("inf")
    for _ in range(max(1, repeat)):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def all_to_all(repeat: int = 3, shape: tuple[int, ...] = (8192, 1024)) -> dict:
    """(a): plan S01 on (16, 8) -> S10 on another (16, 8), 32 hosts of 8 devices."""
    src = Layout(DeviceMesh((16, 8)), "S01R")
    dst = Layout(DeviceMesh((16, 8), devices=range(128, 256)), "S10R")
    cluster = Cluster.preset("dgx-a100", 32)
    secs, p = _best_of(lambda: reshard.plan(shape, np.float32, src, dst, cluster=cluster),
                       repeat)
    return {"name": "(a) 128->128 all-to-all S01->S10", "plan_s": secs,
            "tasks": len(p.tasks), "ratio": p.estimate() / p.lower_bound(), "goal_s": 0.5}


def many_tensors(count: int = 1000, repeat: int = 3, seed: int = 0) -> dict:
    """(b): ``count`` tensors with random paper-style layout pairs, planned together."""
    rng = random.Random(seed)
    a = DeviceMesh((2, 4))
    b = DeviceMesh((2, 4), devices=range(8, 16))
    cluster = Cluster.regular(4, 4)
    reqs = []
    for _ in range(count):
        shape = (rng.choice([64, 256, 1024]), rng.choice([128, 512]), rng.choice([8, 64]))
        reqs.append((shape, np.float32, Layout(a, rng.choice(SPECS)),
                     Layout(b, rng.choice(SPECS))))
    secs, p = _best_of(lambda: reshard.plan_many(reqs, cluster=cluster), repeat)
    return {"name": f"(b) {count} tensors with plan_many", "plan_s": secs,
            "tasks": len(p.tasks), "ratio": p.estimate() / p.lower_bound(), "goal_s": 2.0}


def run(repeat: int = 3) -> list[dict]:
    """Both measurements."""
    return [all_to_all(repeat), many_tensors(repeat=repeat)]

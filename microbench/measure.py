"""Measuring plans on real workers: the pieces every data-plane benchmark shares.

``reshard-bench --mode run`` (cli.py), the data-plane benchmark (dataplane.py) and
the testbed benchmark (testbed_bench.py) all put a value, plan each strategy, time
``Runtime.execute`` over some runs after warm-ups, take the median, count the wrong
destination elements once and free what they made. This module does that once:

* :func:`sample_value`: the seeded random value a benchmark moves;
* :func:`partial_addends`: shards of a value on a layout, random addends where partial;
* :func:`count_wrong`: destination elements whose bits differ from the value;
  :func:`count_wrong_all` of several outputs after their casts (:func:`delivered`);
* :func:`time_execute`: the timed runs of one plan;
* :func:`measure_strategies`: put, then plan (and load) and time every strategy;
* :func:`measured_row`: the JSON row all three report, plus each one's own keys.

Their flags are :mod:`reshard.microbench.flags`; their tables and JSON
:mod:`reshard.microbench.report`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reshard.casting import reference_cast
from reshard.dtypes import Cast, is_float8, max_finite, parse_dtype
from reshard.layout import Layout
from reshard.microbench.suites.paper import Case
from reshard.planner.ir import ReshardPlan


def sample_value(shape: Sequence[int], dtype: str, bound: int = 2**20,
                 seed: int = 0) -> np.ndarray:
    """Seeded random integers in ``[-bound, bound)`` as ``dtype`` (float8: within its
    finite range)."""
    dt = parse_dtype(dtype)
    if is_float8(dt.name):
        bound = min(bound, int(max_finite(dt.name)))
    return np.random.default_rng(seed).integers(-bound, bound, size=shape).astype(dt)


def partial_addends(value: np.ndarray, layout: Layout,
                    draw: Callable[[tuple[int, ...]], np.ndarray]) -> dict[int, np.ndarray]:
    """Per-device shards of ``value`` on ``layout``; on partial axes, addends that sum
    (with the dtype's wrap-around) to the value: ``draw(shape)`` makes all but the first
    of each group, the first gets the rest."""
    boxes = layout.index_map(value.shape)
    shards: dict[int, np.ndarray] = {}
    for group in layout.partial_groups():
        sl = boxes[group[0]]
        rest = [draw(value[sl].shape) for _ in group[1:]]
        lead = value[sl].copy()
        for r in rest:
            lead -= r
        shards[group[0]] = lead
        shards.update(zip(group[1:], rest))
    return shards


def _differ(got: np.ndarray, want: np.ndarray) -> int:
    """Elements whose bits differ (NaNs compare by their bits; dtypes must agree)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return int(want.size)
    width = want.dtype.itemsize
    a = np.ascontiguousarray(got).view(np.uint8).reshape(-1, width)
    b = np.ascontiguousarray(want).view(np.uint8).reshape(-1, width)
    return int(np.count_nonzero(np.any(a != b, axis=1)))


def count_wrong(rt: Any, y: Any, value: np.ndarray) -> int:
    """Elements of every destination shard of ``y`` whose bits differ from the expected
    slice of ``value`` (partial destinations: leaders hold the value, the others
    zeros)."""
    wrong = 0
    shards = rt.shards(y)
    leaders = y.layout.partial_leaders()
    for d, sl in y.layout.index_map(value.shape).items():
        want = value[sl] if d in leaders else np.zeros_like(value[sl])
        wrong += _differ(shards[d], want)
    return wrong


def delivered(value: np.ndarray, cast: Cast | None) -> tuple[np.ndarray, np.ndarray | None]:
    """What a reshard of ``value`` delivers: the value itself, or its cast and scales
    (:func:`reshard.casting.reference_cast`)."""
    if cast is None:
        return value, None
    return reference_cast(value, cast)


def count_wrong_all(rt: Any, ys: Sequence[Any], values: Sequence[np.ndarray],
                    casts: Sequence[Cast | None]) -> int:
    """Wrong elements of every output (and of the scales a scaled cast delivered)
    against what each value, cast as its request says, should give."""
    wrong = 0
    for y, v, c in zip(ys, values, casts):
        want, scales = delivered(v, c)
        wrong += count_wrong(rt, y, want)
        if scales is not None:
            wrong += count_wrong(rt, y.scales, scales)
    return wrong


def time_execute(rt: Any, plan: ReshardPlan, xs: Sequence[Any], runs: int, warmup: int,
                 check: Callable[[list], Any] | None = None,
                 check_run: int = 0,
                 on_run: Callable[[], Any] | None = None) -> tuple[float, list[float], Any]:
    """Run ``plan`` on ``xs`` ``warmup + runs`` times, timing each ``Runtime.execute``
    in the driver; every run's outputs are freed before the next run starts.

    ``check``, if given, is called on the outputs of run ``check_run`` (0: the first,
    -1: the last; warm-ups count) before they are freed, outside the timing.
    ``on_run``, if given, is called after every run (a progress bar's step).

    Returns the median seconds of the ``runs`` timed runs, their seconds, and what
    ``check`` returned (None without one).
    """
    total = warmup + runs
    check_at = check_run % total if check is not None and total else None
    times: list[float] = []
    checked = None
    for i in range(total):
        t0 = time.perf_counter()
        ys = rt.execute(plan, xs)
        elapsed = time.perf_counter() - t0
        if i >= warmup:
            times.append(elapsed)
        if i == check_at and check is not None:
            checked = check(ys)
        rt.free(*ys, *(y.scales for y in ys if y.scales is not None))
        if on_run is not None:
            on_run()
    return statistics.median(times), times, checked


@dataclass
class Measured:
    """One strategy of one case, timed (see :func:`measure_strategies`)."""

    strategy: str
    plan: ReshardPlan
    seconds: float  # median of the timed runs
    times: list[float]  # every timed run
    wrong: int | None  # None when not checked
    plan_seconds: float  # Runtime.plan
    load_seconds: float | None  # the first Runtime.load; None when not loaded apart


def measure_strategies(rt: Any, value: np.ndarray, src: Layout, dst: Layout,
                       strategies: Sequence[str], runs: int, warmup: int, *,
                       load: bool = True, check: bool = True,
                       check_run: int = 0, cast: Cast | None = None,
                       on_run: Callable[[], Any] | None = None) -> Iterator[Measured]:
    """Put ``value`` on ``src``; for every strategy plan the move to ``dst`` (converted
    as ``cast`` says), load it first if ``load`` (else the first run loads it), time it
    with :func:`time_execute` and count the wrong elements of run ``check_run`` if
    ``check`` (``on_run``: called after every run). Frees the source when done."""
    x = rt.put(value, src)
    for strategy in strategies:
        t0 = time.perf_counter()
        plan = rt.plan(x, dst, strategy, cast=cast)
        t_plan = time.perf_counter() - t0
        t_load = None
        if load:
            t0 = time.perf_counter()
            rt.load(plan)
            t_load = time.perf_counter() - t0
        seconds, times, wrong = time_execute(
            rt, plan, [x], runs, warmup,
            check=(lambda ys: count_wrong_all(rt, ys, [value], [cast])) if check else None,
            check_run=check_run, on_run=on_run)
        yield Measured(strategy, plan, seconds, times, wrong, t_plan, t_load)
    rt.free(x)


def measured_row(case: Case, src: Layout, dst: Layout, m: Measured, shape: Any = None,
                 wrong: Any = None, **extra: Any) -> dict:
    """The row every data-plane benchmark reports for ``m``, then ``extra`` (each
    benchmark's own keys), then ``wrong`` (default ``m.wrong``). ``shape`` defaults to
    the case's as a list."""
    row = {
        "case": case.name, "strategy": m.strategy,
        "shape": list(case.shape) if shape is None else shape,
        "dtype": case.dtype, "src": str(src), "dst": str(dst),
        "tensor_bytes": case.nbytes, "bytes_moved": m.plan.bytes_moved(),
        "tasks": len(m.plan.tasks), "seconds": m.seconds, "seconds_all": m.times,
    }
    row.update(extra)
    row["wrong"] = m.wrong if wrong is None else wrong
    return row

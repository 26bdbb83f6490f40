"""The sweep behind ``reshard-bench``: every case x size x strategy, modelled (sim) or
measured on real workers (run), one row each, streamed as it is done.

Rows have the same keys in both modes (JSON ``schema_version`` 1):

* the case: ``case``, ``layouts`` (source and destination specs and meshes), ``src``
  and ``dst`` (the first tensor's layouts on their devices), ``shape`` (the first
  tensor's), ``tensors``, ``dtype``, ``bytes`` (all tensors), ``preset``, ``hosts``,
  ``devices_per_host``;
* the plan: ``strategy``, ``tasks``, ``bytes_moved``, ``plan_ms``;
* the model: ``model_us`` (:meth:`ReshardPlan.estimate`), ``lb_us`` (the lower bound:
  no plan is faster), ``model_over_bound``, ``cast_bandwidth`` (bytes/s each converting
  device casts at, measured through the run's workers where ``--cluster local`` runs a
  case that casts: the plan is made, modelled and bounded knowing it; 0 otherwise);
* measured (None in sim mode): ``measured_us`` (median of ``-n`` runs),
  ``measured_all_us``, ``measured_over_model``, ``measured_over_bound``;
* bandwidths, GB/s = 1e9 bytes/s of ``bytes``: ``model_algbw_gbps``,
  ``measured_algbw_gbps``, ``bound_algbw_gbps`` (bytes / lower bound: what the best
  possible plan would reach);
* correctness: ``wrong`` (destination elements that differ; None when not checked),
  ``checked_bytes`` (the size it was checked at: sim mode runs each case at a small
  size on the local backend; run mode checks the measured run itself).
"""

from __future__ import annotations

import enum
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

import reshard
from reshard.cluster import Cluster
from reshard.comm.backend import builtin_backends
from reshard.dtypes import itemsize, parse_dtype
from reshard.errors import ReshardError
from reshard.layout import box_size
from reshard.microbench.calibrate import Links, with_cast_rate
from reshard.microbench.measure import (
    count_wrong_all,
    partial_addends,
    sample_value,
    time_execute,
)
from reshard.microbench.report import Stream
from reshard.microbench.suites.paper import Case, Request, preset_key
from reshard.planner.ir import ReshardPlan
from reshard.planner.values.digest import digest_tasks
from reshard.presets import GBIT

if TYPE_CHECKING:
    from reshard.runtime import DArray, Runtime


class Mode(enum.Enum):
    """What ``reshard-bench`` does with a plan."""

    SIM = "sim"  # model it (and check it small on the local backend)
    RUN = "run"  # execute and time it on real workers


MEMORY_SHARE = 0.8
"""Run mode refuses a case whose values and shards need more than this share of the
host memory available (the workers, their libraries and the system need the rest)."""


class CaseError(ReshardError):
    """A case cannot be placed on the cluster the flags describe."""


@dataclass(frozen=True)
class Options:
    """The sweep's settings, parsed from the command line once.

    Attributes:
        mode: sim or run.
        strategies: strategy names, in column order.
        sizes: target bytes per case (None: the case's own size).
        preset: link figures for every case (None: each case's own preset).
        nic_gbps: NIC bandwidth override, Gbit/s.
        hosts: hosts of the cluster (None: just enough for each case).
        devices_per_host: devices per host, meshes capped at it (None: the preset's).
        check: count wrong destination elements.
        check_elements: sim mode checks each tensor at about this many elements.
        iters: timed runs (run mode).
        warmup: untimed runs before them (run mode).
        backend: run mode's data plane.
        launcher: run mode's launcher (None: the backend's default).
        timeout: run mode's timeout, seconds.
        max_devices: run mode refuses cases needing more workers.
        links: this machine's measured links (``--cluster local``), per number of
            devices streaming at once: every case's cluster gets the figures measured
            with as many devices as it has (:func:`links_for`).
    """

    mode: Mode
    strategies: tuple[str, ...]
    sizes: tuple[int | None, ...] = (None,)
    preset: str | None = None
    nic_gbps: float | None = None
    hosts: int | None = None
    devices_per_host: int | None = None
    check: bool = True
    check_elements: int = 1 << 14
    iters: int = 5
    warmup: int = 1
    backend: str = "gloo"
    launcher: str | None = None
    timeout: float = 120.0
    max_devices: int = 64
    links: tuple[tuple[int, Links], ...] | None = None

    @property
    def runs(self) -> int:
        """Runs of each plan in run mode, warm-ups included."""
        return self.warmup + self.iters


@dataclass(frozen=True)
class Placed:
    """One case at one size, on its cluster: what a row is made from."""

    case: Case
    requests: tuple[Request, ...]
    cluster: Cluster
    preset: str


def place(case: Case, opts: Options) -> Placed:
    """``case`` on the cluster the options describe: the preset's hosts (or
    ``--hosts`` of them) with ``--devices-per-host`` devices; meshes capped at it."""
    c = case.narrowed(opts.devices_per_host) if opts.devices_per_host else case
    preset = preset_key(opts.preset or c.preset)
    over: dict[str, float] = {"nic_bandwidth": opts.nic_gbps * GBIT} if opts.nic_gbps else {}
    cluster = c.cluster(opts.devices_per_host, preset, **over)
    if opts.links is not None:  # this machine's figures, on the case's own hosts
        over = links_for(opts.links, c.devices_needed).overrides(len(cluster.hosts[0]))
        cluster = c.cluster(opts.devices_per_host, preset, **over)
    if opts.hosts is not None:
        need = max(c.src_mesh[0], c.dst_mesh[0])
        if opts.hosts < need:
            raise CaseError(f"case {c.name} ({c.layout_text()}) needs at least {need} hosts "
                            f"for its largest mesh, --hosts is {opts.hosts}; raise --hosts "
                            f"or leave it out (then each case gets {c.hosts_needed})")
        cluster = Cluster.regular(opts.hosts, len(cluster.hosts[0]), preset=preset, **over)
    return Placed(c, tuple(c.requests_on(cluster)), cluster,
                  "local" if opts.links is not None else preset)


def links_for(links: Sequence[tuple[int, Links]], devices: int) -> Links:
    """The figures measured with the fewest devices at least ``devices`` (else the
    most): what a case of ``devices`` workers gets when all of them move bytes."""
    fits = [lk for n, lk in sorted(links) if n >= devices]
    return fits[0] if fits else max(links)[1]


def sized(case: Case, opts: Options) -> list[Case]:
    """``case`` at each size of the sweep; sizes that round to the same shape once."""
    out: list[Case] = []
    for target in opts.sizes:
        c = case if target is None else case.with_bytes(target)
        if all(c.nbytes != o.nbytes for o in out):
            out.append(c)
    return out


def check_bound(dtype: str) -> int:
    """Magnitude of the sample values: integers below it are exact in ``dtype``, also
    summed over a few partial addends (floats: 2**(mantissa bits - 3))."""
    dt = parse_dtype(dtype)
    if dt.kind in "iub":
        return 2 ** 30
    return int(2 ** max(1, ml_dtypes.finfo(dt).nmant - 3))


def values_of(requests: Sequence[Request]) -> list[np.ndarray]:
    """The seeded values a case moves."""
    return [sample_value(shape, dtype, bound=check_bound(dtype))
            for shape, dtype, *_ in requests]


def put_value(rt: Runtime, value: np.ndarray, layout: reshard.Layout,
              rng: np.random.Generator) -> DArray:
    """Put ``value`` on ``layout``; a partial layout gets random addends that sum to it."""
    if not layout.spec.is_partial:
        return rt.put(value, layout)
    b = check_bound(value.dtype.name)
    shards = partial_addends(
        value, layout, lambda s: rng.integers(-b, b, size=s).astype(value.dtype))
    return rt.put_shards(shards, layout, value.shape, value.dtype)


def small(p: Placed, opts: Options) -> Placed:
    """The case at its checking size: each tensor at about ``check_elements``
    elements, never more than its own size (then it is checked as shown)."""
    if all(math.prod(t.shape) <= opts.check_elements for t in p.case.tensors):
        return p
    return place(p.case.small(opts.check_elements), opts)


def check_small(p: Placed, strategy: str) -> int:
    """Move ``p`` on the local backend (all its tensors in one plan); #wrong elements."""
    values = values_of(p.requests)
    rng = np.random.default_rng(1)
    with reshard.Runtime(backend="local", cluster=p.cluster) as rt:
        xs = [put_value(rt, v, r[2], rng) for v, r in zip(values, p.requests)]
        plan = reshard.plan_many(p.requests, cluster=p.cluster, strategy=strategy)
        ys = rt.execute(plan, xs)
        return count_wrong_all(rt, ys, values, [r[4] for r in p.requests])


def row(p: Placed, plan: ReshardPlan, plan_s: float, times: Sequence[float] | None,
        median: float | None, wrong: int | None, checked_bytes: int | None) -> dict:
    """The row of one case, size and strategy (keys: see the module's docstring)."""
    c = p.case
    model, lb = plan.estimate(), plan.lower_bound()
    src, dst = p.requests[0][2], p.requests[0][3]

    def ratio(a: float | None, b: float) -> float | None:
        return a / b if a is not None and b > 0 else None

    def gbps(seconds: float | None) -> float | None:
        return c.nbytes / seconds / 1e9 if seconds else None

    return {
        "case": c.name, "layouts": c.layout_text(), "src": str(src), "dst": str(dst),
        "shape": list(c.shape), "tensors": len(c.tensors),
        "dtype": c.dtype_text, "bytes": c.nbytes,
        "preset": p.preset, "hosts": p.cluster.num_hosts,
        "devices_per_host": len(p.cluster.hosts[0]),
        "strategy": plan.strategy.value, "tasks": len(plan.tasks),
        "tasks_digest": digest_tasks({}, plan.tasks).hex()[:16],
        "bytes_moved": plan.bytes_moved(), "plan_ms": plan_s * 1e3,
        "model_us": model * 1e6, "lb_us": lb * 1e6, "model_over_bound": ratio(model, lb),
        "cast_bandwidth": plan.cluster.cast_bandwidth,
        "measured_us": None if median is None else median * 1e6,
        "measured_all_us": None if times is None else [t * 1e6 for t in times],
        "measured_over_model": ratio(median, model), "measured_over_bound": ratio(median, lb),
        "model_algbw_gbps": gbps(model), "measured_algbw_gbps": gbps(median),
        "bound_algbw_gbps": gbps(lb),
        "wrong": wrong, "checked_bytes": checked_bytes,
    }


def simulate(cases: Sequence[Case], opts: Options, out: Stream) -> None:
    """Model every case, size and strategy (all of a case's tensors in one plan); with
    ``check``, also move each case small on the local backend and count wrong elements.
    Progress: one step per row."""
    for case in cases:
        for c in sized(case, opts):
            p = place(c, opts)
            checked = small(p, opts) if opts.check else None
            for strategy in opts.strategies:
                out.progress.describe(f"case {c.name}: {strategy}: planning")
                t0 = time.perf_counter()
                plan = reshard.plan_many(p.requests, cluster=p.cluster, strategy=strategy)
                plan_s = time.perf_counter() - t0
                wrong = None
                if checked is not None:
                    out.progress.describe(f"case {c.name}: {strategy}: checking "
                                          f"{checked.case.nbytes} B on the local backend")
                    wrong = check_small(checked, strategy)
                out.row(row(p, plan, plan_s, None, None, wrong,
                            checked.case.nbytes if checked is not None else None))
                out.progress.advance()


def host_bytes(requests: Sequence[Request]) -> int:
    """Bytes a backend on host memory (local, gloo, tcp, nixl) holds for ``requests``: the
    driver's values, every source and destination shard."""
    total = 0
    for shape, dtype, src, dst, *_ in requests:
        item = itemsize(dtype)
        total += 2 * math.prod(shape) * item
        for lay in (src, dst):
            total += sum(box_size(b) for b in lay.boxes(shape).values()) * item
    return total


def _available_memory() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def devices_refusal(p: Placed, opts: Options) -> str | None:
    """Why run mode cannot start ``p``'s workers here, or None."""
    devices = len(p.cluster.devices)
    if devices > opts.max_devices:
        return (f"needs {devices} worker devices ({p.cluster.num_hosts} hosts x "
                f"{len(p.cluster.hosts[0])}), more than --max-devices {opts.max_devices}; "
                f"model it with --mode sim, narrow it with --devices-per-host, or raise "
                f"--max-devices")
    return None


def memory_refusal(p: Placed, opts: Options) -> str | None:
    """Why run mode cannot hold ``p``'s values and shards in host memory, or None."""
    if builtin_backends().entry(opts.backend).capabilities.device == "cpu":
        need, have = host_bytes(p.requests), _available_memory()
        if have and need > MEMORY_SHARE * have:
            return (f"needs about {need / 2**30:.1f} GiB of host memory for its values and "
                    f"shards, over {MEMORY_SHARE:.0%} of the {have / 2**30:.1f} GiB available "
                    f"(the rest is the workers' own and the system's); size it with -b/-e")
    return None


def measure(cases: Sequence[Case], opts: Options, out: Stream,
            refused: list[dict]) -> str | None:
    """Execute every case, size and strategy on real workers and time them (all of a
    case's tensors in one plan); one Runtime per case, its sizes one after another.
    Cases this machine cannot hold are refused with a note (and kept in ``refused``).
    Progress: one step per run (warm-ups included).

    Returns:
        The launcher the Runtimes used (None if every case was refused).
    """
    launcher = None
    for case in cases:
        todo = sized(case, opts)
        placed = [place(c, opts) for c in todo]
        why = devices_refusal(placed[0], opts)
        if why:
            for p in placed:
                _refuse(p, why, opts, out, refused)
            continue
        out.progress.describe(f"case {case.name}: starting {len(placed[0].cluster.devices)} "
                              f"{opts.backend} workers")
        with reshard.Runtime(backend=opts.backend, cluster=placed[0].cluster,
                             launcher=opts.launcher, timeout=opts.timeout) as rt:
            launcher = rt.launcher.value
            # this machine's figures: the case's converting devices' cast rate too, so
            # the plans are made knowing what converting costs here
            cluster = with_cast_rate(rt, placed[0].cluster, placed[0].requests) \
                if opts.links is not None else placed[0].cluster
            for p in placed:
                why = memory_refusal(p, opts)
                if why:
                    _refuse(p, why, opts, out, refused)
                else:
                    _measure_one(rt, p, opts, out, cluster)
    return launcher


def _refuse(p: Placed, why: str, opts: Options, out: Stream, refused: list[dict]) -> None:
    out.note(f"# refused {p.case.name} ({p.case.nbytes} B): {why}")
    refused.append({"case": p.case.name, "bytes": p.case.nbytes, "why": why})
    out.progress.advance(len(opts.strategies) * opts.runs)


def _measure_one(rt: Runtime, p: Placed, opts: Options, out: Stream,
                 cluster: Cluster) -> None:
    values = values_of(p.requests)
    rng = np.random.default_rng(1)
    xs = [put_value(rt, v, r[2], rng) for v, r in zip(values, p.requests)]
    casts = [r[4] for r in p.requests]

    def check(ys: list) -> int:
        return count_wrong_all(rt, ys, values, casts)

    try:
        for strategy in opts.strategies:
            out.progress.describe(f"case {p.case.name} ({p.case.nbytes} B): {strategy}")
            t0 = time.perf_counter()
            plan = reshard.plan_many(p.requests, cluster=cluster, strategy=strategy)
            plan_s = time.perf_counter() - t0
            # the first run loads the plan; the last run's result is checked
            median, times, wrong = time_execute(
                rt, plan, xs, opts.iters, opts.warmup, check=check if opts.check else None,
                check_run=-1, on_run=out.progress.advance)
            out.row(row(p, plan, plan_s, times, median, wrong,
                        p.case.nbytes if opts.check else None))
    finally:
        rt.free(*xs)

"""Helpers shared by the real-process tests (and the GPU tier)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import queue
import sys
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, settings

from reshard import Cluster, Layout
from reshard.casting import reference_cast
from reshard.dtypes import Cast, accumulate, parse_dtype
from reshard.microbench.suites.paper import Case, n_to_m_cases

from .. import common
from ..common import DTYPES, STRATEGIES, addends, check_shards, sample  # noqa: F401

# Eight workers, four hosts of two devices: the paper's (n, 4) meshes at half width.
WORLD = Cluster.regular(4, 2)
FAKE_CUPY = pathlib.Path(__file__).parent / "fake_cupy"


@dataclass(frozen=True)
class PaperCase:
    """A paper case at reduced size, placed on :data:`WORLD` (see :func:`paper_cases`)."""

    case: Case
    dst_first_host: int | None = None  # None: the host after the source's

    @property
    def name(self) -> str:
        """The paper's case number."""
        return self.case.name

    @property
    def shape(self) -> tuple[int, ...]:
        """Global shape."""
        return self.case.shape

    def narrowed(self, g: int) -> PaperCase:
        """The case with every mesh (n, x) made (n, g)."""
        return PaperCase(self.case.narrowed(g), self.dst_first_host)

    def layouts(self, cluster: Cluster = WORLD) -> tuple[Layout, Layout]:
        """Source and destination layouts on ``cluster`` (Case.layouts_on)."""
        return self.case.layouts_on(cluster, self.dst_first_host)


def paper_cases() -> tuple[PaperCase, ...]:
    """The paper's cases 1-7 and 9 (int32) on :data:`WORLD`: meshes (n, 4) become
    (n, 2), shapes (1024, 1024, 512) become (16, 16, 8). Source and destination sit
    on distinct hosts, except case 6, whose (2, 2) -> (3, 2) needs five hosts: its
    destination starts on the source's second host (overlapping meshes)."""
    out = []
    for c in n_to_m_cases():
        small = c.narrowed(2).with_shape((24, 16, 5) if c.name == "6" else (16, 16, 8))
        out.append(PaperCase(small, 1 if c.name == "6" else None))
    return tuple(out)


def problems(devices: tuple[int, ...] = WORLD.devices):
    """Random problems (tests/common.py) over :data:`WORLD`: 1-2 axis meshes."""
    return common.problems(devices, max_ndim=2, max_size=len(devices))


def problem_settings(max_examples: int) -> settings:
    """Hypothesis settings of the tiers that run :func:`problems` on real workers: the
    same examples every run, no example database, no deadline."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ----- test bodies shared by the gloo, fake-nccl and GPU tiers ----------------------------
def check_strategies(rt, x, dst: Layout, value: np.ndarray) -> None:
    """Reshard ``x`` to ``dst`` with every strategy: each result exact, then freed."""
    for strategy in STRATEGIES:
        y = rt.reshard(x, dst, strategy)
        check_shards(rt, y, value)
        rt.free(y)


def check_paper_case(rt, case: PaperCase, cluster: Cluster = WORLD) -> None:
    """The case's int32 value (seeded by the case number) placed on ``cluster``,
    exact after every strategy."""
    src, dst = case.layouts(cluster)
    value = sample(np.random.default_rng(int(case.name)), case.shape, "int32")
    x = rt.put(value, src)
    check_strategies(rt, x, dst, value)
    rt.free(x)


def check_random_problem(rt, problem) -> None:
    """A random ``(shape, dtype, src, dst)`` (:func:`problems`; seeded by itself): the
    source put as random addends where partial, exact after every strategy."""
    shape, dtype, src, dst = problem
    rng = np.random.default_rng(zlib.crc32(repr((shape, dtype, src, dst)).encode()))
    value = sample(rng, shape, dtype)
    x = rt.put_shards(addends(rng, value, src), src, shape, dtype)
    check_strategies(rt, x, dst, value)
    rt.free(x)


def check_partial_sum(rt, shape: tuple[int, ...], src: Layout, dst: Layout, dtype: str,
                      seed: int = 5) -> None:
    """Random addends whose float32 sum is exact (:func:`common.narrow_addends`) put as
    ``src``'s partial shards: after every strategy each destination shard holds the
    reference sum (summed in the accumulator, rounded once), and the caller's addends
    are untouched."""
    shards = common.narrow_addends(np.random.default_rng(seed), shape, src, dtype)
    boxes = src.index_map(shape)
    want = np.zeros(shape, parse_dtype(dtype))
    for group in src.partial_groups():
        want[boxes[group[0]]] = accumulate([shards[d] for d in group], dtype)
    x = rt.put_shards(shards, src, shape, dtype)
    for strategy in STRATEGIES:
        y = rt.reshard(x, dst, strategy)
        check_shards(rt, y, want)
        rt.free(y)
    kept = rt.shards(x)
    assert all(kept[d].tobytes() == shards[d].tobytes() for d in shards)  # untouched
    rt.free(x)


def check_cast(rt, src_dtype: str, cast: Cast, shape: tuple[int, ...], src: Layout,
               dst: Layout, seed: int = 9) -> None:
    """Values of very different magnitudes per row (:func:`common.cast_values`) cast on
    the wire: after every strategy the destination shards and scales equal
    :func:`reshard.casting.reference_cast`'s bit for bit."""
    x = common.cast_values(np.random.default_rng(seed), shape, src_dtype)
    want, want_scales = reference_cast(x, cast)
    a = rt.put(x, src)
    for strategy in STRATEGIES:
        y = rt.reshard(a, dst, strategy, cast=cast.dtype, scale=cast.scale)
        assert y.dtype == cast.dtype
        check_shards(rt, y, want)
        if want_scales is None:
            assert y.scales is None
        else:
            check_shards(rt, y.scales, want_scales)
        rt.free(y)
    rt.free(a)


# ----- processes ------------------------------------------------------------------------
def pid_alive(pid: int) -> bool:
    """True if a process with this id exists (and is not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: Iterable[int], timeout: float = 15.0) -> list[int]:
    """The pids still alive after waiting up to ``timeout`` seconds."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def rank_results(target, ranks: Iterable[int], wait: float, join: float = 5.0) -> dict:
    """Run ``target(device, rendezvous_address, results, done)`` in a process per rank
    (each puts ``(device, dict)``, or a traceback on failure, into ``results``; ``done``
    is set once every rank reported, so ranks may stay up until then) and return
    ``{device: dict}``, failing the test on the first rank's traceback (at once: the
    others may be waiting for the failed one in a collective)."""
    import multiprocessing as mp

    from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer

    ranks = tuple(ranks)
    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods()
                         else "spawn")
    server = TcpRendezvousServer()
    results, done = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=target, args=(d, server.address, results, done),
                         daemon=True) for d in ranks]
    try:
        for p in procs:
            p.start()
        got = {}
        end = time.monotonic() + wait
        while len(got) < len(ranks):
            try:
                d, r = results.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                missing = sorted(set(ranks) - set(got))
                raise AssertionError(f"ranks {missing} did not report within {wait:g}s "
                                     f"(the others did)") from None
            assert isinstance(r, dict), f"device {d} failed:\n{r}"
            got[d] = r
    finally:
        done.set()
        for p in procs:
            p.join(join)
            if p.is_alive():
                p.kill()
        server.close()
    return got


@contextlib.contextmanager
def fake_nccl_runtime(cluster: Cluster, timeout: float = 30):
    """A Runtime of the ``nccl`` backend on the fake cupy (tests/cpu/fake_cupy, whose
    NCCL is gloo), its workers started by exec so they import the fake."""
    import pytest

    from reshard.runtime import Runtime

    # a real cupy the contract tests (tests/contract) loaded steps aside meanwhile: the
    # driver must not hold any cupy (its workers import the fake)
    real = {k: sys.modules.pop(k) for k in list(sys.modules)
            if k.split(".")[0] in ("cupy", "cupyx", "cupy_backends")}
    mp = pytest.MonkeyPatch()
    mp.setenv("RESHARD_START_METHOD", "spawn")
    mp.syspath_prepend(str(FAKE_CUPY))  # spawn children inherit the driver's sys.path
    try:
        with Runtime("nccl", cluster, "process", timeout=timeout) as runtime:
            yield runtime
    finally:
        mp.undo()
        for k in [k for k in sys.modules if k.split(".")[0] in ("cupy", "cupyx", "cupy_backends")]:
            del sys.modules[k]
        sys.modules.update(real)


def thread_policies(pid: int) -> dict[tuple[str, int], str]:
    """``{(thread name, thread id): scheduling policy}`` of every thread of process
    ``pid`` (:func:`reshard.comm.launchers.scheduling.policy_of`), skipping threads
    that end meanwhile."""
    from reshard.comm.launchers.scheduling import policy_of

    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                out[f.read().strip(), int(tid)] = policy_of(int(tid))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out

"""reshard.model_sync: a model's weights synced in versions, planned once; readers on the
engine's ranks see only whole versions while 100 syncs land, on tcp and nixl (and the
same reader sees torn ones when the sync writes in place, which shows it can), each
told the version it holds even when syncs and reads race; a trainer's sync returns only
once the engines hold its version; snapshots let the trainer write at once; versions
only increase; buffers of another dtype are refused when the sync is built. Faults
(a trainer rank killed mid-sync): test_model_sync_faults.py."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.comm.backends.tcp import TcpBackend
from reshard.comm.executor import Executor
from reshard.errors import ExecutionError, ReshardError
from reshard.microbench.model_sync_soak import classify
from reshard.model_sync import ModelSync, Param

from .test_tcp_backend import PLANES, _ok, _ranks

pytestmark = pytest.mark.cpu

TRAIN, ENGINE = DeviceMesh((2,), [0, 1]), DeviceMesh((2,), [2, 3])
PARAMS = [Param("embed", (1024, 256), "float32", Layout(TRAIN, "S0R"), Layout(ENGINE, "S0R")),
          Param("q_proj", (512, 256), "float32", Layout(TRAIN, "S0R"), Layout(ENGINE, "RS0")),
          Param("o_proj", (256, 512), "float32", Layout(TRAIN, "S0R"), Layout(ENGINE, "RS0")),
          Param("norm", (256,), "float32", Layout(TRAIN, "S0"), Layout(ENGINE, "R"))]
CLUSTER = Cluster.regular(2, 2)
SYNCS = 100


def _shards(device: int, version: int) -> dict[str, np.ndarray]:
    """This trainer rank's shards at ``version``: every element the version."""
    out = {}
    for p in PARAMS:
        box = p.src.boxes(p.shape).get(device)
        if box is not None:
            out[p.name] = np.full(tuple(b - a for a, b in box), float(version), np.float32)
    return out


def _versioned(mode: str, plane: str = "tcp", syncs: int = SYNCS) -> dict[int, dict]:
    """Every rank syncs ``syncs`` versions; on each engine rank a reader thread reads
    whole weight sets meanwhile. Per engine rank: reads, torn reads, the final version."""
    def body(b: TcpBackend) -> dict:
        ex = Executor(b)
        with ModelSync(ex, PARAMS, CLUSTER, mode=mode) as sync:
            stop = threading.Event()
            seen = {"reads": 0, "torn": 0, "versions": set()}

            def reader() -> None:
                while not stop.is_set():
                    with sync.reading() as (version, weights):
                        if version < 0:
                            continue
                        lows = [float(w.min()) for w in weights.values()]
                        highs = [float(w.max()) for w in weights.values()]
                    seen["reads"] += 1
                    seen["versions"].add(version)
                    if set(lows) | set(highs) != {float(version)}:
                        seen["torn"] += 1

            engine = b.device in ENGINE.devices
            thread = threading.Thread(target=reader) if engine else None
            if thread is not None:
                thread.start()
            for v in range(syncs):
                sync.sync(_shards(b.device, v), v)
            stop.set()
            if thread is not None:
                thread.join(30)
            return {**seen, "version": sync.version, "memory": sync.memory}

    return _ok(_ranks(body, world=(0, 1, 2, 3), timeout=60, join=300, plane=plane))


@pytest.mark.timeout(400)
@pytest.mark.parametrize("plane", PLANES)
@pytest.mark.parametrize("mode", ["double", "lock"])
def test_readers_see_only_whole_versions(mode, plane):
    syncs = SYNCS if plane == "tcp" else 40  # nixl's ranks on threads are slower here
    got = _versioned(mode, plane, syncs)
    for d in ENGINE.devices:
        r = got[d]
        assert r["version"] == syncs - 1
        assert r["reads"] >= 20 and len(r["versions"]) >= 5, r  # reads overlapped syncs
        assert r["torn"] == 0, r
    # double buffering holds two sets of this rank's shards
    for d in ENGINE.devices:
        shard_bytes = sum(4 * int(np.prod([b - a for a, b in p.dst.boxes(p.shape)[d]]))
                          for p in PARAMS)
        assert got[d]["memory"] == (2 if mode == "double" else 1) * shard_bytes


@pytest.mark.timeout(400)
def test_the_same_reader_sees_torn_versions_when_syncs_write_in_place():
    """The negative control: mode "none" writes the live buffers; the reader above
    catches the mix (so its zero under "double" and "lock" means something)."""
    got = _versioned("none")
    assert sum(got[d]["torn"] for d in ENGINE.devices) > 0, got


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["lock", "double"])
def test_a_read_is_told_the_version_it_holds(mode):
    """1,000 tiny syncs from one trainer rank to one engine rank while a reader reads
    as fast as it can, threads switching every 10 us: every read's label is the
    version of every element it holds (a sync that ended its write and recorded its
    version in two steps told a reader v-1 while it held v: 25 of 7,000 reads here in
    500 syncs)."""
    train, engine = DeviceMesh((1,), [0]), DeviceMesh((1,), [1])
    params = [Param(n, (8,), "float32", Layout(train, "R"), Layout(engine, "R"))
              for n in ("a", "b")]

    def body(b: TcpBackend) -> dict:
        counts = {"whole": 0, "torn": 0, "mislabelled": 0}
        with ModelSync(Executor(b), params, Cluster.regular(1, 2), mode=mode) as sync:
            stop = threading.Event()

            def reader() -> None:
                while not stop.is_set():
                    with sync.reading() as (version, weights):
                        kind = None if version < 0 else classify(version, dict(weights))
                    if kind is not None:
                        counts[kind] += 1

            thread = threading.Thread(target=reader) if b.device == 1 else None
            if thread is not None:
                thread.start()
            for v in range(1000):
                sync.sync({n.name: np.full(8, v, np.float32) for n in params}
                          if b.device == 0 else None, v)
            stop.set()
            if thread is not None:
                thread.join(30)
        return counts

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        got = _ok(_ranks(body, world=(0, 1), timeout=60, join=240))
    finally:
        sys.setswitchinterval(interval)
    assert got[1]["whole"] >= 100, got  # the reads overlapped the syncs
    assert got[1]["mislabelled"] == 0 and got[1]["torn"] == 0, got


@pytest.mark.timeout(120)
def test_a_source_sync_returns_only_once_the_engines_hold_the_version():
    """Engine rank 3 takes versions 0-2 and never 3: the trainer ranks' sync of 3
    raises within the backend's timeout (3 s) naming the version, instead of returning
    because its bytes fit in the sockets' buffers; engine rank 2, whose bytes of 3 all
    landed, raises too and its readers stay on 2 (3 is not on every engine rank)."""
    small = [Param("w", (64, 32), "float32", Layout(TRAIN, "S0R"), Layout(ENGINE, "RS0"))]
    others_done = threading.Event()
    left = [3]  # ranks still in their sync of 3

    def body(b: TcpBackend) -> object:
        with ModelSync(Executor(b), small, CLUSTER) as sync:
            mine = {} if b.device in ENGINE.devices else \
                {"w": np.full((32, 32), 1.0, np.float32)}
            for v in range(3):
                sync.sync(mine, v)
            if b.device == 3:
                others_done.wait(60)  # alive, but not taking version 3
                return sync.version
            t0 = time.monotonic()
            try:
                with pytest.raises(ExecutionError, match="version 3 is done on this rank "
                                                         "but not every rank"):
                    sync.sync(mine, 3)
                took = time.monotonic() - t0
                with sync.reading() as (version, _):
                    return took, version
            finally:
                left[0] -= 1
                if not left[0]:
                    others_done.set()

    got = _ok(_ranks(body, world=(0, 1, 2, 3), timeout=3, join=90))
    assert got[3] == 2
    assert got[2][1] == 2  # its bytes of 3 landed, unconfirmed: not given to readers
    assert all(got[d][0] < 10 for d in (0, 1, 2)), got  # the backend's timeout, not later


@pytest.mark.timeout(120)
def test_a_buffer_of_another_dtype_is_refused_when_the_sync_is_built():
    """An engine's float16 buffer for a float32 shard: refused by the constructor,
    naming the tensor, the dtype given and the one expected (not at the first sync)."""
    def body(b: TcpBackend) -> object:
        given = {}
        if b.device == 2:
            given = {"q_proj": np.zeros((512, 128), np.float16)}
        try:
            with ModelSync(Executor(b), PARAMS, CLUSTER, buffers=given):
                return "built"
        except ReshardError as e:
            return str(e)

    got = _ok(_ranks(body, world=(0, 1, 2, 3)))
    assert got[0] == got[1] == got[3] == "built"
    assert "buffer 'q_proj' has dtype float16" in got[2], got[2]
    assert "is float32, shape (512, 128)" in got[2], got[2]


@pytest.mark.timeout(120)
def test_ranks_given_different_versions_are_refused():
    """The engines sync version 5 while the trainers sync 6: every rank's sync raises,
    naming the others' version (the confirmation's all-gather), and no engine rank's
    readers are given the bytes under either label."""
    def body(b: TcpBackend) -> object:
        with ModelSync(Executor(b), PARAMS, CLUSTER) as sync:
            v = 5 if b.device in ENGINE.devices else 6
            with pytest.raises(ExecutionError, match="ranks synced another version") as e:
                sync.sync(_shards(b.device, v), v)
            failure = sync.failure
            assert failure is not None
            with sync.reading() as (version, _):
                return str(e.value), version, failure.version

    got = _ok(_ranks(body, world=(0, 1, 2, 3)))
    assert "{2: 5, 3: 5}" in got[0][0] and "{0: 6, 1: 6}" in got[2][0], got
    assert got[2][1:] == got[3][1:] == (-1, 5)  # still nothing synced, version 5 failed


@pytest.mark.timeout(120)
def test_a_snapshot_lets_the_trainer_write_at_once():
    """With ``snapshot``, a trainer that overwrites its weights as soon as a
    non-blocking sync returns still delivers the version it gave."""
    def body(b: TcpBackend) -> object:
        with ModelSync(Executor(b), PARAMS, CLUSTER, snapshot=True) as sync:
            ready: list[int] = []
            waiter = threading.Thread(target=lambda: ready.append(sync.wait_version(5, 60)))
            waiter.start()  # the engine's "version ready" point, before any sync
            for v in (3, 4, 5):
                mine = _shards(b.device, v)
                handle = sync.sync(mine, v, blocking=False)
                for w in mine.values():
                    w[...] = -1.0  # the optimizer's next step, at once
                assert handle.wait(60) == v
                if b.device in ENGINE.devices:
                    with sync.reading() as (version, weights):
                        assert version == v
                        assert all((w == v).all() for w in weights.values())
            waiter.join(60)
            assert ready == [5]
            with pytest.raises(ExecutionError, match=r"version 9 did not land within 0\.1s"):
                sync.wait_version(9, 0.1)
            return sync.version

    assert set(_ok(_ranks(body, world=(0, 1, 2, 3))).values()) == {5}


def test_versions_only_increase_and_bad_input_is_refused():
    def body(b: TcpBackend) -> object:
        with ModelSync(Executor(b), PARAMS, CLUSTER, mode="lock") as sync:
            sync.sync(_shards(b.device, 7), 7)
            with pytest.raises(ReshardError, match="version 7 is not newer than 7"):
                sync.sync(_shards(b.device, 7), 7)
            with pytest.raises(ReshardError, match="version 6 is not newer"):
                sync.sync(_shards(b.device, 6), 6)
            with pytest.raises(ReshardError, match=r"sources \['bias'\] are not parameters"):
                sync.sync({"bias": np.zeros(3)}, 8)
            sync.sync(_shards(b.device, 9), 9)  # still usable: nothing moved meanwhile
            return sync.version

    assert set(_ok(_ranks(body, world=(0, 1, 2, 3))).values()) == {9}
    with pytest.raises(ReshardError, match="valid: \\['double', 'lock', 'none'\\]"):
        ModelSync(None, PARAMS, CLUSTER, mode="swap")  # type: ignore[arg-type]


@pytest.mark.timeout(120)
def test_the_overhead_benchmark_runs(capsys):
    """microbench/model_sync_bench.py (small): prints both medians and their ratio."""
    from reshard.microbench import model_sync_bench

    assert model_sync_bench.main(["--layers", "1", "--width", "64", "--rounds", "3"]) == 0
    out = capsys.readouterr().out
    assert "ModelSync.sync" in out and "ratio" in out and "stolen CPU" in out

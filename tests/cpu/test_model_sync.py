"""reshard.model_sync: a model's weights synced in versions, planned once; readers on the
engine's ranks see only whole versions while 100 syncs land (and the same reader sees
torn ones when the sync writes in place, which shows it can); snapshots let the trainer
write at once; versions only increase."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.comm.backends.tcp import TcpBackend
from reshard.comm.executor import Executor
from reshard.errors import ExecutionError, ReshardError
from reshard.model_sync import ModelSync, Param

from .test_tcp_backend import _ok, _ranks

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


def _versioned(mode: str) -> dict[int, dict]:
    """Every rank syncs SYNCS versions; on each engine rank a reader thread reads whole
    weight sets meanwhile. Per engine rank: reads, torn reads, the final version."""
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
            for v in range(SYNCS):
                sync.sync(_shards(b.device, v), v)
            stop.set()
            if thread is not None:
                thread.join(30)
            return {**seen, "version": sync.version, "memory": sync.memory}

    return _ok(_ranks(body, world=(0, 1, 2, 3), timeout=60, join=300))


@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["double", "lock"])
def test_readers_see_only_whole_versions(mode):
    got = _versioned(mode)
    for d in ENGINE.devices:
        r = got[d]
        assert r["version"] == SYNCS - 1
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

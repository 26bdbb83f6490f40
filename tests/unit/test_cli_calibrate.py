"""reshard-bench's run mode sized for one machine and its ``--cluster local``: the
links, per-message costs and cast rates it measures on this machine (calibration) and the
clusters it models from them."""

from __future__ import annotations

import json

import pytest

import reshard
from reshard.microbench import cli as bench_cli
from reshard.microbench import sweep

from .test_cli import _bench


def _resolved(argv):
    ap = bench_cli.build_parser()
    return bench_cli.resolve(ap, ap.parse_args(argv))


def test_run_mode_is_sized_for_one_machine_unless_told(capsys):
    opts, _ = _resolved(["--mode", "run", "--cases", "1"])
    assert opts.sizes == bench_cli.RUN_SIZES and max(bench_cli.RUN_SIZES) <= 16 << 20
    opts, _ = _resolved(["--mode", "run", "--cases", "1", "--full-size"])
    assert opts.sizes == (None,)
    opts, _ = _resolved(["--cases", "1"])  # sim mode models the paper's sizes
    assert opts.sizes == (None,)
    assert _resolved(["--cases", "1", "--full-size"])[0].mode is sweep.Mode.RUN
    for argv, says in ((["--full-size", "-b", "1M"], "drop one of them"),
                       (["--cluster", "local", "--nic-gbps", "10"], "drop one of them")):
        code, _, err = _bench(["--cases", "1", *argv], capsys)
        assert code == 2 and says in err, err


def test_cluster_local_models_this_machines_measured_links(monkeypatch):
    from reshard.microbench import calibrate

    asked = []
    backends = []

    def fake(counts, backend=None):
        counts = list(counts)
        asked.extend(counts)
        backends.append(backend)
        return {p: calibrate.Links(1e9, 1e-4, 1e10, p, 0.8e9 * p, message_cost=3e-5)
                for p in counts}

    monkeypatch.setattr(calibrate, "measure_many", fake)
    opts, cases = _resolved(["--mode", "run", "--cluster", "local", "--cases", "1,7"])
    assert sorted(asked) == sorted(c.devices_needed // 2 for c in cases)  # one per count
    assert backends == ["gloo"]  # the run's backend: its messages are timed
    assert sorted(c.devices_needed for c in cases) == [12, 16]
    for case in cases:
        p = sweep.place(case, opts)
        assert p.preset == "local" and p.cluster.name == "local"
        assert p.cluster.intra_bandwidth == sweep.links_for(opts.links, case.devices_needed).bandwidth
        per_host = len(p.cluster.hosts[0])
        assert p.cluster.nics_per_host == per_host
        assert p.cluster.nic_bandwidth == p.cluster.intra_bandwidth * per_host
        # every link shares what the case's pairs moved at once, and the bound says so
        assert p.cluster.shared_bandwidth == 0.8e9 * (case.devices_needed // 2)
        assert p.cluster.message_cost == 3e-5


def test_cluster_local_prices_a_cast_at_the_rate_its_workers_convert(monkeypatch, tmp_path,
                                                                      capsys):
    """--cluster local measures the cast rate of a case's converting devices through the
    run's workers (once a case) and the model charges it: each row says the rate, and
    its model is the plan's on the local figures with that rate; a case that casts
    nothing measures none."""
    import dataclasses

    from reshard.microbench import calibrate

    monkeypatch.setattr(calibrate, "measure_many", lambda counts, backend=None: {
        p: calibrate.Links(1e9, 1e-4, 1e10, p, 0.8e9 * p) for p in counts})
    asked = []

    def rate(rt, devices, cast, dtype="bfloat16", nbytes=8 << 20, rounds=3):
        asked.append((tuple(devices), str(cast), dtype))
        return 5e7

    monkeypatch.setattr(calibrate, "runtime_cast_bandwidth", rate)
    base = ["--mode", "run", "--backend", "local", "--cluster", "local", "--suite", "n-to-m",
            "--cases", "5", "-b", "1M", "-e", "1M", "--strategies", "broadcast", "-n", "1",
            "-w", "0", "-d", "bfloat16"]
    out = tmp_path / "cast.json"
    assert _bench([*base, "--cast", "float8_e4m3fn", "--scale", "block128",
                   "-J", str(out)], capsys)[0] == 0
    (row,) = json.loads(out.read_text())["rows"]
    opts, (case,) = _resolved([*base, "--cast", "float8_e4m3fn", "--scale", "block128"])
    p = sweep.place(sweep.sized(case, opts)[0], opts)
    (devices, cast, dtype), = asked
    assert devices == tuple(sorted(p.requests[0][2].mesh.devices)) and dtype == "bfloat16"
    assert "float8_e4m3fn" in cast
    plan = reshard.plan_many(p.requests, cluster=p.cluster, strategy="broadcast")
    priced = reshard.plan_many(p.requests, strategy="broadcast",
                               cluster=dataclasses.replace(p.cluster, cast_bandwidth=5e7))
    assert row["cast_bandwidth"] == 5e7 and row["wrong"] == 0
    assert row["tasks_digest"] == sweep.digest_tasks({}, priced.tasks).hex()[:16]
    assert row["model_us"] == pytest.approx(priced.estimate() * 1e6)
    assert priced.estimate() > plan.estimate()  # the conversions are charged
    assert row["lb_us"] == pytest.approx(priced.lower_bound() * 1e6)  # and bounded
    assert priced.lower_bound() > plan.lower_bound()
    asked.clear()
    assert _bench([*base, "-J", str(out)], capsys)[0] == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["cast_bandwidth"] == 0.0 and not asked


def test_calibration_measures_loopback_streams():
    from reshard.microbench import calibrate

    links = calibrate.measure(2, nbytes=4 << 20, round_trips=20)
    assert links.pairs == 2 and 1e7 < links.bandwidth < 1e12
    assert links.shared >= links.bandwidth
    assert 0 < links.latency < 0.1 and links.copy_bandwidth > 1e8
    assert "2 pairs" in links.describe()


def test_calibration_times_a_backends_messages():
    from reshard.microbench import calibrate

    assert calibrate.measurable("gloo") and calibrate.measurable("tcp")
    assert not calibrate.measurable("local")  # its ranks are threads of one process
    assert not calibrate.measurable("nccl")  # a GPU per rank
    cost = calibrate.message_cost("tcp", count=64, rounds=2)
    assert 1e-7 < cost < 1e-2  # a microsecond to a few milliseconds of the machine
    links = calibrate.Links(1e9, 1e-4, 1e10, 1, 1e9, message_cost=cost)
    assert links.overrides(2)["message_cost"] == cost
    assert "per message end" in links.describe()
    # what a runtime moves per busy second of the machine's cores, 2 pairs at once, and
    # spends on each of 1,024 boxes riding in a coalesced message (a CPU cost per box of
    # the worker and the backend: tens of ms in all, well above a jiffy's resolution)
    import reshard
    from reshard.dtypes import Cast, ScaleMode

    busy = calibrate.busy_seconds()
    with reshard.Runtime("tcp", reshard.Cluster.regular(2, 2), "process") as rt:
        rate = calibrate.runtime_shared(rt, [0, 1], [2, 3], nbytes=8 << 20, rounds=1)
        part = calibrate.runtime_part_cost(rt, [0, 1], [2, 3], rounds=2)
        with pytest.raises(ValueError, match="pair devices"):
            calibrate.runtime_shared(rt, [0, 1], [2])
        # what two devices converting bfloat16 to block-scaled float8 at once manage
        cast = calibrate.runtime_cast_bandwidth(rt, [0, 1], Cast(
            "float8_e4m3fn", ScaleMode.BLOCK128), nbytes=2 << 20, rounds=1)
        with pytest.raises(ValueError, match="converts nothing"):
            calibrate.runtime_cast_bandwidth(rt, [0], "bfloat16")
    assert 1e7 < rate < 1e12  # 10 MB/s to 1 TB/s of the machine
    assert 1e-7 < part < 1e-3
    assert 1e5 < cast < 1e11  # 100 kB/s to 100 GB/s a device
    assert calibrate.busy_seconds() > busy


def test_calibration_keeps_the_best_round(monkeypatch):
    # a lower bound must not exceed what the machine can do: slow rounds are noise
    from reshard.microbench import calibrate

    measured = {(1, False): [[4.0], [1.0], [2.0]], (1, True): [[0.5], [0.2], [0.9]],
              (2, False): [[3.0, 2.0], [1.0, 1.5], [5.0, 1.0]],
              (2, True): [[0.6, 0.4], [0.3, 0.35], [0.8, 0.2]]}
    monkeypatch.setattr(calibrate, "_streams",
                        lambda pairs, n, ping, rounds=1: measured[(pairs, ping)])
    monkeypatch.setattr(calibrate, "_copy_bandwidth", lambda: 1e10)
    links = calibrate.measure(2, nbytes=1000, round_trips=10)
    assert links.bandwidth == 1000 / 1.0  # the fastest of 4, 1 and 2 s
    # half the round trip of the slowest pair of the fastest round, both pairs at once
    assert links.latency == 0.35 / 10 / 2
    assert links.alone_latency == 0.2 / 10 / 2  # one pair alone: its fastest round
    # a busy round trip faster than one pair alone is noise: the alone figure stays
    measured[(2, True)] = [[0.1, 0.1]]
    assert calibrate.measure(2, nbytes=1000, round_trips=10).latency == 0.2 / 10 / 2
    assert links.shared == 2 * 1000 / 1.5  # the slowest pair of the fastest round


def test_a_round_under_the_busy_clocks_tick_reads_one_tick(monkeypatch):
    """A round that moved its bytes between two ticks of /proc/stat's busy clock (0
    busy seconds read) gives a floor of the rate (one tick), not bytes over nothing."""
    import os
    from types import SimpleNamespace

    import reshard
    from reshard.microbench import calibrate

    monkeypatch.setattr(calibrate, "_least_busy", lambda *_a, **_k: 0.0)
    rt = SimpleNamespace(cluster=reshard.Cluster.regular(2, 2), put=lambda x, layout: x)
    rate = calibrate.runtime_shared(rt, [0, 1], [2, 3], nbytes=8 << 20, rounds=1)
    cores = len(os.sched_getaffinity(0))
    assert rate == 2 * (8 << 20) * cores * os.sysconf("SC_CLK_TCK")
    monkeypatch.setattr(calibrate, "_least_busy", lambda *_a, **_k: 0.5)
    assert calibrate.runtime_shared(rt, [0, 1], [2, 3], nbytes=8 << 20) == \
        2 * (8 << 20) / (0.5 / cores)

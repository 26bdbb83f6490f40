"""The realistic and weight-sync suites, the generalised Case, and the planner-time
measurements (structure only: no timing asserts)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import reshard
from reshard.dtypes import Cast, ScaleMode
from reshard.microbench import cli as bench_cli
from reshard.microbench import planner_time
from reshard.microbench.suites import SUITES
from reshard.microbench.suites.paper import Case, Tensor, n_to_m_cases
from reshard.microbench.suites.realistic import realistic_cases
from reshard.microbench.suites.weight_sync import (
    LLAMA2_7B,
    weight_sync_cases,
    weight_sync_requests,
)
from reshard.planner.plan import make_tensor_spec

ALL = {c.name: c for c in realistic_cases() + weight_sync_cases()}


def test_suites_are_registered_with_unique_names():
    assert {"paper", "n-to-m", "1-to-m", "realistic", "weight-sync"} <= set(SUITES)
    names = [c.name for c in SUITES["realistic"]()]
    assert len(names) == len(set(names)) and 15 <= len(names) <= 25
    assert {c.preset_name for c in realistic_cases()} >= {
        "aws-p3.8xlarge", "dgx-h100", "aws-p4d.24xlarge", "aws-p5.48xlarge"}


@pytest.mark.parametrize("name", list(ALL))
def test_case_builds_valid_layouts_on_its_cluster(name):
    case = ALL[name]
    reqs, cluster = case.build_many()
    assert cluster.name == case.preset_name
    assert cluster.num_hosts == case.hosts_needed
    assert len(reqs) == len(case.tensors)
    for shape, dtype, src, dst, _ in reqs:
        make_tensor_spec(shape, dtype, src, dst, cluster)  # raises on a bad request
    src, dst = reqs[0][2], reqs[0][3]
    ns, gs = case.src_mesh
    nd, gd = case.dst_mesh
    assert src.mesh.shape == case.src_mesh and dst.mesh.shape == case.dst_mesh
    # the source on the first hosts, the destination where the case says, each mesh
    # row on one host
    first = ns if case.dst_first_host is None else case.dst_first_host
    for lay, n, g, h0 in ((src, ns, gs, 0), (dst, nd, gd, first)):
        rows = np.asarray(lay.mesh.devices).reshape(n, g)
        for i, row in enumerate(rows):
            assert {cluster.host_of(int(d)) for d in row} == {h0 + i}
    shared = set(src.devices) & set(dst.devices)
    assert bool(shared) == (case.dst_first_host is not None and case.dst_first_host < ns)
    assert len(set(src.devices) | set(dst.devices)) == case.devices_needed


def test_overlapping_cases_share_hosts_with_their_source():
    for name, first in (("rep-to-shard-overlap", 1), ("rep-to-shard-same-hosts", 0)):
        src, dst, cluster = ALL[name].build()
        src_hosts = {cluster.host_of(d) for d in src.devices}
        dst_hosts = {cluster.host_of(d) for d in dst.devices}
        assert min(dst_hosts) == first and src_hosts & dst_hosts


SMALL = {"a2a-testbed-3x2": (48, 30), "tp-row-rrp1-to-rs0": (16, 24),
         "uneven-odd-3d": (13, 11, 7), "rep-to-shard-same-hosts": (40, 36),
         "tp-col-to-rep-2x8": (4, 6, 40), "unequal-3x8-to-5x8": (45, 41)}


@pytest.mark.parametrize("strategy", ["send_recv", "allgather", "broadcast"])
@pytest.mark.parametrize("name", list(SMALL))
def test_small_cases_plan_and_verify(name, strategy):
    reqs, cluster = ALL[name].with_shape(SMALL[name]).build_many()
    p = reshard.plan_many(reqs, cluster=cluster, strategy=strategy)
    p.verify()
    assert p.tasks and p.estimate() >= p.lower_bound() > 0


def test_realistic_sim_run_checks_two_cases(capsys):
    code = bench_cli.main(["--suite", "realistic", "--cases", "a2a-testbed-3x2,uneven-odd-3d",
                           "-c", "1", "--check-elements", "2048"])
    text = capsys.readouterr().out
    assert code == 0
    rows = [line for line in text.splitlines() if not line.startswith("#")
            and line.split() and line.split()[0] in ("a2a-testbed-3x2", "uneven-odd-3d")]
    assert len(rows) == 6
    assert all(line.split()[-1] == "0" for line in rows)  # #wrong
    assert "S0R@3x2->RS0@3x2" in text and "aws-p3.8xlarge" in text
    assert "Out of bounds values : 0 OK" in text


def _llama_bytes(layers: int, itemsize: int = 2) -> int:
    h, m, v = 4096, 11008, 32000
    per_layer = 4 * h * h + 3 * m * h + 2 * h
    return (layers * per_layer + 2 * v * h + h) * itemsize


def test_weight_sync_whole_model_is_llama2_7b():
    reqs, cluster = weight_sync_requests()
    assert len(reqs) == 32 * 9 + 3 == 291
    assert LLAMA2_7B.num_parameters == 6_738_415_616  # the published Llama-2-7B count
    assert sum(math.prod(s) * np.dtype(d).itemsize for s, d, *_ in reqs) == _llama_bytes(32)
    assert cluster.name == "dgx-h100" and cluster.num_hosts == 6
    src_devs = {d for r in reqs for d in r[2].devices}
    dst_devs = {d for r in reqs for d in r[3].devices}
    assert len(src_devs) == 32 and len(dst_devs) == 16 and not src_devs & dst_devs


def test_weight_sync_to_fp8_casts_the_linear_layers():
    """The fp8 case converts exactly the linear layers (block scales), the rest stays
    bf16; modelled, it takes about half the bf16 sync's time (its bytes are about half)."""
    bf16, fp8 = ALL["weight-sync-2l"], ALL["weight-sync-2l-fp8"]
    casts = {t.name: t.cast for t in fp8.tensors}
    assert {n for n, c in casts.items() if c is not None} == {
        n for n, _, kind in LLAMA2_7B.sliced(2).parameters() if kind in ("column", "row")}
    assert all(c == Cast("float8_e4m3fn", ScaleMode.BLOCK128) for c in casts.values() if c)
    # one strategy for both (the default may take another's plan per tensor set)
    p16 = reshard.plan_many(*bf16.build_many(), strategy="send_recv")
    p8 = reshard.plan_many(*fp8.build_many(), strategy="send_recv")
    linear = sum(math.prod(t.shape) for t in fp8.tensors if t.cast)
    assert p16.bytes_moved() - p8.bytes_moved() > 0.99 * linear  # a byte saved per element
    assert p8.lower_bound() < p16.lower_bound()


def test_weight_sync_slice_planned_together():
    case = ALL["weight-sync-2l"]
    reqs, cluster = case.build_many()
    p = reshard.plan_many(reqs, cluster=cluster, strategy="broadcast")
    assert len(p.tensors) == 2 * 9 + 3 == 21
    total = sum(math.prod(t.shape) * np.dtype(t.dtype).itemsize for t in p.tensors)
    assert total == _llama_bytes(2) == case.nbytes
    by_shape_spec = {(t.shape, str(t.src.spec), str(t.dst.spec)) for t in p.tensors}
    assert ((4096, 4096), "S01R", "S1R") in by_shape_spec  # q/k/v: column-parallel
    assert ((4096, 4096), "S01R", "RS1") in by_shape_spec  # o: row-parallel
    assert ((4096, 11008), "S01R", "RS1") in by_shape_spec  # down
    assert ((11008, 4096), "S01R", "S1R") in by_shape_spec  # gate/up
    assert ((32000, 4096), "S01R", "S1R") in by_shape_spec  # embedding / lm_head
    assert ((4096,), "S01", "R") in by_shape_spec  # norms
    # every inference device ends up with its TP slice: a destination holds 1/8 of each
    # split weight and all of each norm
    assert p.lower_bound() > 0 and p.estimate() >= p.lower_bound()


def test_weight_sync_requests_on_a_given_cluster():
    cluster = reshard.Cluster.regular(3, 2)
    reqs, got = weight_sync_requests(LLAMA2_7B.sliced(1).narrowed(64), train_mesh=(2, 2),
                                     infer_mesh=(1, 2), cluster=cluster)
    assert got is cluster and len(reqs) == 12
    assert reqs[1][0] == (64,) and reqs[2][0] == (64, 64)
    p = reshard.plan_many(reqs, cluster=cluster)
    p.verify()


def test_case_generalisation_keeps_paper_behaviour_and_scales_many():
    c1 = n_to_m_cases()[0]
    src, _, cluster = c1.build()
    assert cluster.name == "aws-p3.8xlarge" and len(cluster.hosts[0]) == 4
    assert cluster.num_hosts == 4 and src.devices == tuple(range(8))
    # an explicit preset replaces the links only, hosts keep the case's width
    _, _, h100 = c1.build(preset="dgx-h100")
    assert h100.name == "dgx-h100" and len(h100.hosts[0]) == 4
    many = Case.many("m", [Tensor((64, 32), "float32", "S0R", "RS0"),
                           Tensor((100,), "float16", "S01", "R")], (2, 4), (2, 4))
    assert many.nbytes == 64 * 32 * 4 + 100 * 2
    half = many.with_bytes(many.nbytes // 4)
    assert len(half.tensors) == 2 and half.tensors[1].shape == (25,)
    assert half.tensors[0].shape == (32, 16)
    small = ALL["weight-sync-7b"].small(1024)
    assert len(small.tensors) == 291 and max(math.prod(t.shape) for t in small.tensors) <= 1100


def test_cli_cluster_flag_overrides_only_when_given(tmp_path):
    import json
    out = tmp_path / "b.json"
    args = ["--suite", "realistic", "--cases", "a2a-flat-4x8", "-c", "0", "--strategies",
            "broadcast", "-J", str(out)]
    assert bench_cli.main(args) == 0
    own = json.loads(out.read_text())["rows"][0]
    assert own["preset"] == "dgx-h100"
    assert bench_cli.main([*args, "--cluster", "paper"]) == 0
    paper = json.loads(out.read_text())["rows"][0]
    assert paper["preset"] == "aws-p3.8xlarge"
    assert paper["model_us"] > 10 * own["model_us"]  # 10 Gbit/s NICs, not 3.2 Tbit/s


def test_summary_names_worst_case_and_counts_baseline_wins():
    def row(case, strategy, t, lb=1.0):
        return {"case": case, "bytes": 8, "strategy": strategy, "model_us": t, "lb_us": lb,
                "model_over_bound": t / lb, "measured_us": None, "wrong": 0}
    rows = [row("a", "send_recv", 4.0), row("a", "allgather", 2.0), row("a", "broadcast", 1.0),
            row("b", "send_recv", 1.5), row("b", "allgather", 3.0), row("b", "broadcast", 2.0)]
    lines = bench_cli.summary(rows, "demo", bench_cli.Mode.SIM, checked=True)
    assert "MISSED in 1 of 2 rows, case b; worst 2.000 (case b," in lines[0]
    assert lines[1].startswith("# model: broadcast slower than the best of "
                               "send_recv/allgather in 1 of 2 cases: b")


def test_measured_summary_marks_the_rows_where_the_default_ran_the_baselines_plan():
    def row(case, strategy, t, digest):
        return {"case": case, "bytes": 8, "strategy": strategy, "model_us": 1.0,
                "lb_us": 1.0, "model_over_bound": 1.0, "measured_us": t, "wrong": 0,
                "tasks_digest": digest}
    rows = [row("a", "send_recv", 4.0, "p"), row("a", "allgather", 5.0, "q"),
            row("a", "broadcast", 4.4, "p"),  # send_recv's plan: slower by the spread
            row("b", "send_recv", 4.0, "p"), row("b", "allgather", 5.0, "q"),
            row("b", "broadcast", 4.8, "r")]  # a plan of its own, slower
    lines = bench_cli.summary(rows, "demo", bench_cli.Mode.RUN, checked=True)
    measured = next(ln for ln in lines if ln.startswith("# measured:"))
    assert "in 2 of 2 cases: a (+10.0%, same plan), b (+20.0%)" in measured
    assert measured.endswith("; 1 of them the baseline's own plan (the runs' spread)")
    model = next(ln for ln in lines if ln.startswith("# model:"))
    assert "same plan" not in model


def test_run_mode_refuses_cases_too_big_for_the_machine(capsys):
    code = bench_cli.main(["--mode", "run", "--backend", "local", "--suite", "realistic",
                           "--cases", "a2a-16x8", "-b", "64K", "--max-devices", "16"])
    assert code == 2
    assert "refused a2a-16x8" in capsys.readouterr().out


def test_planner_time_all_to_alls_are_all_to_alls():
    rows = planner_time.run(repeat=1, big="none", counts=(20,), sweep=(16, 32))
    a2a = [r for r in rows if "slope" in r]
    # every source device sends a piece to every destination device: D * D tasks
    assert [(r["devices"], r["tasks"]) for r in a2a] == [(16, 256), (32, 1024)]
    assert all(isinstance(r["ratio"], float) and r["ratio"] >= 1.0 - 1e-9 for r in rows)
    assert rows[-1]["name"].endswith("20 tensors")
    text = planner_time.render(rows)
    assert "planning time grows as devices^" in text
    skipped = planner_time.all_to_all(16, repeat=1, cost_limit=10)
    assert skipped["ratio"] == "n/a"


def test_growth_exponent_is_the_log_log_slope():
    rows = [{"devices": d, "plan_s": 3e-6 * d ** 2} for d in (16, 32, 64, 128)]
    assert planner_time.growth_exponent(rows) == pytest.approx(2.0)

"""``reshard serve`` as a real process: it serves, and SIGTERM drains a call in flight
and exits 0."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import grpc
import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.service import Client, convert, plan_codec
from reshard.service.v1 import reshard_pb2_grpc as pb_grpc

pytestmark = pytest.mark.cpu


def start_serve(*flags: str) -> tuple[subprocess.Popen, str]:
    """``reshard serve --port 0 FLAGS`` and the address it reports."""
    proc = subprocess.Popen([sys.executable, "-m", "reshard.cli", "serve", "--port", "0",
                             *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise AssertionError(f"reshard serve did not start: {line!r} {proc.stderr.read()!r}")
    return proc, line.split("listening on ", 1)[1].split()[0]


@pytest.mark.timeout(90)
def test_sigterm_drains_the_call_in_flight_and_exits_zero():
    proc, address = start_serve("--backend", "none", "--grace", "30")
    try:
        src = Layout(DeviceMesh((8, 8)), "S01R")  # an all-to-all: 4,096 tasks
        dst = Layout(DeviceMesh((8, 8), devices=range(64, 128)), "RS10")
        cluster = Cluster.preset("dgx-h100", 16)
        args = ((4096, 4096), "uint16", src, dst)
        request = convert.request_to_pb([args], cluster, "broadcast")
        request.max_chunk_tasks = 16  # 256 chunks, more than the stream's window holds
        slow_reader = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 8192)]
        with grpc.insecure_channel(address, options=slow_reader) as ch:
            stream = pb_grpc.ReshardStub(ch).PlanMany(request, timeout=60)
            chunks = [next(stream)]  # the call is in flight, held back by flow control
            os.kill(proc.pid, signal.SIGTERM)
            time.sleep(1.0)
            assert proc.poll() is None, "exited without waiting for the call in flight"
            with Client(address, timeout=3) as late:
                assert not late.health(timeout=3)  # draining: no new calls
            chunks += list(stream)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "draining" in out and "stopped" in out
        merged, _ = plan_codec.merge_chunks(chunks)
        assert len(chunks) == chunks[0].count > 100
        assert plan_codec.plan_from_pb(merged) == reshard.plan(*args, cluster=cluster)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.timeout(60)
def test_serve_answers_with_its_default_cluster_and_token(tmp_path):
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    proc, address = start_serve("--cluster", "paper:4x2", "--token-file", str(token))
    try:
        src = Layout(DeviceMesh((2, 2)), "S0R")
        dst = Layout(DeviceMesh((2, 2), devices=range(4, 8)), "RS0")
        with Client(address, token="t0ken") as c:
            got = c.plan((8, 8), "int32", src, dst)  # no cluster: the server's
            assert got == reshard.plan((8, 8), "int32", src, dst, cluster=Cluster.regular(4, 2))
            assert c.version().backend == "local"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


@pytest.mark.timeout(120)
def test_service_bench_measures_both_rpcs_against_a_real_server(tmp_path, monkeypatch, capsys):
    from reshard.microbench import service_bench

    paper = service_bench.cases()[0]
    monkeypatch.setattr(service_bench, "cases", lambda: (paper,))
    out = tmp_path / "bench.json"
    assert service_bench.main(["--requests", "20", "--seconds", "0.2", "--clients", "1",
                               "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["rpc"], r["mode"]) for r in rows] == [
        ("Estimate", "cold"), ("Estimate", "cached"), ("Plan", "cold"), ("Plan", "cached")]
    for r in rows:
        assert r["requests"] >= 3 and r["per_s"] > 0 and r["inproc_ms"] > 0
        assert r["added_ms"] == pytest.approx(r["p50_ms"] - r["inproc_ms"])
    assert "Estimate goal >= 1000 req/s" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_the_client_example_of_docs_service_md_runs():
    from reshard.service import ServeOptions, Server

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.DOTALL)[0]
    with Server(ServeOptions(port=0)).start() as server:
        exec(compile(code.replace("127.0.0.1:50051", server.address), "service.md", "exec"),  # noqa: S102 - the doc's own example
             {})
        assert server.host.handles == 0  # the example freed what it kept

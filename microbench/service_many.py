"""EstimateMany under hostile load: a ``reshard serve`` process of its own, hostile
client threads sending batches, one good client asking new small Estimates.

Three loads (issue 61's items 1, 3 and 4):

* ``starve`` (default): ``--hostile`` threads each repeat EstimateMany batches of
  ``--batch`` distinct n -> n moves (``--devices``, default 512 -> 512: S0 -> S0 over
  n / 4 DGX H100 hosts, a new first dim each, never cached), with ``--deadline``; for
  ``--seconds`` the good client asks new small Estimates (a 4-device move, a new shape
  each) with a 10 s deadline. Prints the good client's p50 / p99 and its failures, how
  the hostile calls ended, and the load and CPU steal of the machine meanwhile::

      python -m reshard.microbench.service_many [--hostile 8 --batch 64 --devices 512]

* ``long``: the same with batches of tiny distinct moves (2 -> 2 devices), by default
  100,000 a batch (``--batch``): how long one call held the server, and the good
  client's latency next to it::

      python -m reshard.microbench.service_many --load long [--hostile 1]

* ``search``: the hostile threads each repeat Search calls of a search built to hold it
  (16 layers x ``--candidates`` candidates, every one a distinct layout pair, on every
  submesh shape of 2 x 4 devices; microbatches grow by one a call: never cached) with
  ``--deadline`` (default 2 s); how late after their deadline the calls ended (p50, p99,
  max), beside the good client's latency::

      python -m reshard.microbench.service_many --load search [--hostile 8 --candidates 8]

* ``bad``: ``--requests`` distinct bad requests (each a cluster preset named by 4,000
  characters: an error text of ~4 KB per answer) in batches of ``--batch``; the server's
  RSS before, at its peak and after, next to what its cache budgets allow::

      python -m reshard.microbench.service_many --load bad --requests 300000

The hostile clients run in a process of their own (their encoding never competes with
the good client for one interpreter), each batch encoded from a template message; every
call goes through raw bytes.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import grpc

from reshard import Cluster, DeviceMesh, Layout
from reshard.microbench import flags
from reshard.microbench.procmem import memory_mib
from reshard.microbench.steal import cpu_times, stolen_note
from reshard.service import Client, ServiceError
from reshard.service.convert import request_to_pb
from reshard.service.options import MIB
from reshard.service.v1 import reshard_pb2 as pb

METHOD = "/reshard.v1.Reshard/EstimateMany"
VIA_METHODS = {"many": METHOD, "estimate": METHOD.replace("EstimateMany", "Estimate"),
               "search": METHOD.replace("EstimateMany", "Search")}
"""The method each hostile load calls (``many``: a stream of answers)."""
MESSAGE_OPTIONS = [("grpc.max_send_message_length", 64 * MIB),
                   ("grpc.max_receive_message_length", 64 * MIB)]


@contextlib.contextmanager
def serve(*serve_flags: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """A ``reshard serve --backend none --port 0`` process (with ``serve_flags``) and
    its address, terminated when the block ends."""
    proc = subprocess.Popen([sys.executable, "-m", "reshard.cli", "serve", "--port", "0",
                             "--backend", "none", *serve_flags], stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if "listening on" not in line:
            raise RuntimeError(f"reshard serve did not start: {line!r}")
        yield proc, line.split("listening on ", 1)[1].split()[0]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def move_template(devices: int) -> pb.PlanRequest:
    """A PlanRequest of an n -> n S0 -> S0 move over n / 4 DGX H100 hosts (first dim
    4 n; :func:`batch` makes each distinct); 2 -> 2 devices and no cluster for n = 2."""
    if devices <= 2:
        src, dst = Layout(DeviceMesh((2,)), "S0R"), Layout(DeviceMesh((2,), (2, 3)), "RS0")
        return request_to_pb([((8, 8), "float32", src, dst, None)], None, "broadcast")
    cluster = Cluster.preset("dgx-h100", max(1, devices // 4))
    src = Layout(DeviceMesh((devices,)), "S0R")
    dst = Layout(DeviceMesh((devices,), devices=range(devices, 2 * devices)), "S0R")
    return request_to_pb([((4 * devices, 64), "float32", src, dst, None)], cluster,
                         "broadcast")


def batch(template: pb.PlanRequest, first: int, count: int) -> bytes:
    """An EstimateManyRequest of ``count`` copies of ``template`` whose first dims grow
    by one from ``first`` past the template's (distinct requests, never cached)."""
    base = template.tensors[0].shape[0]
    msg = pb.EstimateManyRequest()
    for k in range(first, first + count):
        r = msg.requests.add()
        r.CopyFrom(template)
        r.tensors[0].shape[0] = base + k
    return msg.SerializeToString()


def one_request(template: pb.PlanRequest, k: int) -> bytes:
    """``template`` with its first dim grown by ``k`` (a distinct request), encoded."""
    r = pb.PlanRequest()
    r.CopyFrom(template)
    r.tensors[0].shape[0] += k
    return r.SerializeToString()


def hostile_search(candidates: int = 8, seed: int = 0) -> pb.SearchRequest:
    """A Search of 16 layers, every candidate a distinct layout pair and weight on every
    submesh shape of a 2 x 4 cluster (tests/unit/test_search_input.py's instance: the
    search held for minutes before it kept deadlines)."""
    import random

    from reshard.search import Candidate, Layer
    from reshard.service.search_codec import search_request

    rng = random.Random(seed)
    specs = ["RR", "S0R", "RS1", "S1R", "RS0", "S01R", "RS01", "S0S1", "S1S0"]
    shapes = [(1, 1), (1, 2), (1, 4), (2, 4)]
    layers = [Layer(f"l{k}", (1024, 1024), "float32", {
        s: tuple(Candidate(f"c{j}", rng.uniform(1e-4, 1e-2), rng.choice(specs),
                           rng.choice(specs), rng.randrange(1, 1 << 20))
                 for j in range(candidates)) for s in shapes}) for k in range(16)]
    return search_request(layers, Cluster.regular(2, 4), 8, memory_limit=1 << 40)


def one_search(template: pb.SearchRequest, k: int) -> bytes:
    """``template`` with ``k`` more microbatches (a distinct request), encoded."""
    r = pb.SearchRequest()
    r.CopyFrom(template)
    r.microbatches += k
    return r.SerializeToString()


def _count(outcomes: dict[str, int], lock: threading.Lock, name: str) -> None:
    with lock:
        outcomes[name] = outcomes.get(name, 0) + 1


def hostile_load(address: str, threads: int, make: Callable[[int], bytes], deadline: float,
                 seconds: float, via: str = "many"
                 ) -> tuple[dict[str, int], list[tuple[str, float]]]:
    """``threads`` threads calling EstimateMany (``via="estimate"``: Estimate;
    ``"search"``: Search) with ``make(i)`` (the i-th request) for ``seconds``; their
    outcomes by status, and each call's status and seconds."""
    outcomes: dict[str, int] = {}
    held: list[tuple[str, float]] = []
    lock = threading.Lock()
    counter = iter(range(1 << 40))
    until = time.monotonic() + seconds

    def attack() -> None:
        with grpc.insecure_channel(address, options=MESSAGE_OPTIONS) as ch:
            many = ch.unary_stream(METHOD)
            one = ch.unary_unary(VIA_METHODS[via])
            while time.monotonic() < until:
                with lock:
                    i = next(counter)
                raw = make(i)
                t0 = time.monotonic()
                try:
                    if via == "many":
                        for _ in many(raw, timeout=deadline):
                            pass
                    else:
                        one(raw, timeout=deadline)
                    name = "OK"
                except grpc.RpcError as e:
                    name = e.code().name
                with lock:
                    held.append((name, time.monotonic() - t0))
                _count(outcomes, lock, name)

    out = [threading.Thread(target=attack, daemon=True) for _ in range(threads)]
    for t in out:
        t.start()
    for t in out:
        t.join(seconds + deadline + 30)
    return outcomes, held


def _attacker(address: str, threads: int, template: bytes, size: int, deadline: float,
              seconds: float, via: str, out: Any) -> None:
    """A process's hostile load (:func:`hostile_load` of ``template``'s batches, or of
    single requests), its numbers put on ``out``: the attack's client side never
    competes with the good client for one interpreter."""
    if via == "search":
        s = pb.SearchRequest.FromString(template)
        out.put(hostile_load(address, threads, lambda i: one_search(s, i), deadline,
                             seconds, via))
        return
    t = pb.PlanRequest.FromString(template)
    make = ((lambda i: batch(t, i * size, size)) if via == "many" else
            (lambda i: one_request(t, i)))
    out.put(hostile_load(address, threads, make, deadline, seconds, via))


def good_client(address: str, until: float) -> tuple[list[float], dict[str, int]]:
    """New small Estimates (a 4-device move, a new shape each, 10 s deadline) until
    ``until``: each one's seconds, and the failures by status."""
    src = Layout(DeviceMesh((2, 2)), "S0R")
    dst = Layout(DeviceMesh((4,), devices=range(4, 8)), "RS0")
    latencies: list[float] = []
    failed: dict[str, int] = {}
    with Client(address) as good:
        k = 0
        while time.monotonic() < until:
            t0 = time.monotonic()
            try:
                good.estimate((64 + k, 32), "float32", src, dst, timeout=10)
                latencies.append(time.monotonic() - t0)
            except ServiceError as e:
                name = e.code.name if e.code is not None else "ERROR"
                failed[name] = failed.get(name, 0) + 1
            k += 1
            time.sleep(0.01)  # a client, not a flood of its own
    return latencies, failed


def _quantiles(latencies: list[float],
               method: Literal["inclusive", "exclusive"] = "exclusive") -> tuple[float, float]:
    """p50 and p99 of ``latencies`` in ms (NaN for fewer than two; ``method`` as
    :func:`statistics.quantiles` takes it: ``"inclusive"`` stays within the sample)."""
    if len(latencies) < 2:
        return float("nan"), float("nan")
    q = statistics.quantiles(latencies, n=100, method=method)
    return q[49] * 1e3, q[98] * 1e3


def contended(load: str, seconds: float, hostile: int, size: int, devices: int,
              deadline: float, serve_flags: Sequence[str] = (), quiet: float = 5.0,
              via: str = "many", candidates: int = 8) -> dict:
    """The ``starve`` / ``long`` / ``search`` load (module docstring), after ``quiet``
    seconds of the good client alone (the machine's own latency, for comparison); the
    numbers. ``via="estimate"``: the same moves one per Estimate call instead."""
    if load == "search":
        via, template = "search", hostile_search(candidates)
    else:
        template = move_template(devices if load == "starve" else 2)
    with serve(*serve_flags) as (proc, address):
        with Client(address) as warm:  # imports and the first plan, before timing
            warm.estimate((8, 8), "float32", Layout(DeviceMesh((2,)), "S0R"),
                          Layout(DeviceMesh((2,)), "RS0"), timeout=60)
        alone, _ = good_client(address, time.monotonic() + quiet)
        before_cpu, load_before = cpu_times(), os.getloadavg()[0]
        until = time.monotonic() + seconds
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        attacker = ctx.Process(target=_attacker, args=(
            address, hostile, template.SerializeToString(), size, deadline, seconds, via,
            queue), daemon=True)
        attacker.start()
        time.sleep(min(3.0, seconds / 4))  # its interpreter starts, its threads attack
        latencies, failed = good_client(address, until)
        outcomes, held = queue.get(timeout=deadline + 60)
        attacker.join(10)
        rss = memory_mib(proc.pid)
    p50, p99 = _quantiles(latencies)
    quiet50, quiet99 = _quantiles(alone)
    late = sorted(s - deadline for name, s in held if name == "DEADLINE_EXCEEDED")
    late50, late99 = _quantiles(late, "inclusive")  # a few dozen calls: within them
    return {"load": load, "via": via, "hostile": hostile, "batch": size, "devices": devices,
            "quiet_p50_ms": quiet50, "quiet_p99_ms": quiet99,
            "good_ok": len(latencies), "good_failed": failed, "good_p50_ms": p50,
            "good_p99_ms": p99, "good_max_ms": max(latencies, default=0.0) * 1e3,
            "hostile_outcomes": outcomes,
            "hostile_longest_s": max((s for _, s in held), default=0.0),
            "late_p50_ms": late50, "late_p99_ms": late99,
            "late_max_ms": max(late, default=float("nan")) * 1e3,
            "server_rss_peak_mb": rss.get("VmHWM", 0.0), "load_avg": load_before,
            "steal": stolen_note(before_cpu, cpu_times())}


def bad_request(k: int, name_chars: int = 4000) -> pb.PlanRequest:
    """A request whose answer is an error of about ``name_chars`` characters: its
    cluster names an unknown preset (``k`` makes it distinct)."""
    src, dst = Layout(DeviceMesh((2,)), "S0R"), Layout(DeviceMesh((2,), (2, 3)), "RS0")
    msg = request_to_pb([((8, 8), "float32", src, dst, None)], None, "broadcast")
    msg.cluster.preset.name = f"{k}-" + "x" * name_chars
    msg.cluster.preset.num_hosts = 1
    return msg


def bad_answers(requests: int, size: int, serve_flags: Sequence[str] = ()) -> dict:
    """The ``bad`` load (module docstring); the server's memory."""
    template = bad_request(0)
    with serve(*serve_flags) as (proc, address), \
            grpc.insecure_channel(address, options=MESSAGE_OPTIONS) as ch:
        call = ch.unary_stream(METHOD, response_deserializer=pb.EstimateManyReply.FromString)
        list(call(batch(template, -1, 1), timeout=60))  # warm
        before = memory_mib(proc.pid)["VmRSS"]
        errors, t0 = 0, time.monotonic()
        for first in range(0, requests, size):
            raw = batch(template, first, min(size, requests - first))
            for reply in call(raw, timeout=120):
                errors += sum(1 for r in reply.results if r.error)
        seconds = time.monotonic() - t0
        mem = memory_mib(proc.pid)
    return {"requests": requests, "errors": errors, "seconds": seconds,
            "rss_before_mb": before, "rss_peak_mb": mem["VmHWM"],
            "rss_after_mb": mem["VmRSS"]}


def _what(args: Any, r: dict, deadline: float) -> str:
    """What the hostile threads sent, for the printed line."""
    if args.load == "search":
        return (f"Searches of 16 layers x {args.candidates} candidates with a {deadline:g} s "
                f"deadline (those stopped ended past it by p50 {r['late_p50_ms']:.0f} ms, "
                f"p99 {r['late_p99_ms']:.0f} ms, max {r['late_max_ms']:.0f} ms; negative: "
                f"before it)")
    moves = "tiny" if args.load == "long" else f"{r['devices']} -> {r['devices']}"
    sent = f"batches of {r['batch']}" if args.via == "many" else "Estimates of"
    return f"{sent} {moves} moves"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one load and print its numbers."""
    ap = flags.parser("python -m reshard.microbench.service_many", __doc__ or "")
    ap.add_argument("--load", choices=("starve", "long", "search", "bad"), default="starve",
                    help="which hostile load (module docstring)")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the load lasts")
    ap.add_argument("--hostile", type=int, default=None,
                    help="hostile threads (default 8; long: 1)")
    ap.add_argument("--batch", type=int, default=None,
                    help="requests per EstimateMany (default 64; long: 100,000; bad: 1,000)")
    ap.add_argument("--devices", type=int, default=512, help="starve: n of the n -> n moves")
    ap.add_argument("--deadline", type=float, default=None,
                    help="the hostile calls' deadline, s (default 10; long: 300; search: 2)")
    ap.add_argument("--candidates", type=int, default=8,
                    help="search: candidates per layer and submesh shape")
    ap.add_argument("--via", choices=("many", "estimate"), default="many",
                    help="starve / long: the hostile moves by EstimateMany batches, or one "
                         "per Estimate call (for comparison)")
    ap.add_argument("--requests", type=int, default=300_000, help="bad: distinct requests")
    ap.add_argument("--serve-flag", action="append", default=[], metavar="FLAG",
                    help="a flag for reshard serve (repeat; e.g. --serve-flag=--workers=8)")
    args = ap.parse_args(argv)
    if args.load == "bad":
        r = bad_answers(args.requests, args.batch or 1000, args.serve_flag)
        print(f"{r['requests']} distinct bad requests ({r['errors']} error answers) in "
              f"{r['seconds']:.1f} s: server RSS {r['rss_before_mb']:.0f} MB before, peak "
              f"{r['rss_peak_mb']:.0f} MB, after {r['rss_after_mb']:.0f} MB")
        return 0
    long = args.load == "long"
    hostile = args.hostile if args.hostile is not None else 1 if long else 8
    deadline = args.deadline or {"long": 300.0, "search": 2.0}.get(args.load, 10.0)
    r = contended(args.load, args.seconds, hostile,
                  args.batch or (100_000 if long else 64), args.devices, deadline,
                  args.serve_flag, via=args.via, candidates=args.candidates)
    print(f"{r['load']}: {r['hostile']} hostile threads, {_what(args, r, deadline)}: good "
          f"client alone p50 {r['quiet_p50_ms']:.1f} ms, p99 "
          f"{r['quiet_p99_ms']:.1f} ms; under the load {r['good_ok']} OK, failed {r['good_failed']}, p50 {r['good_p50_ms']:.1f} ms, "
          f"p99 {r['good_p99_ms']:.1f} ms, max {r['good_max_ms']:.0f} ms; hostile calls "
          f"{r['hostile_outcomes']}, longest {r['hostile_longest_s']:.1f} s; server peak "
          f"RSS {r['server_rss_peak_mb']:.0f} MB; load average {r['load_avg']:.2f} at the start"
          f"{r['steal']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``reshard serve``: its flags, and running the server until SIGTERM / SIGINT.

Example::

    reshard serve                                   # 127.0.0.1:50051, local backend
    reshard serve --port 0 --cluster paper:4x4      # a free port; 4 p3.8xlarge hosts
    RESHARD_SERVICE_TOKEN=... reshard serve --host 10.0.0.5 \\
        --tls-cert server.pem --tls-key server.key     # off loopback: TLS, or --insecure

Prints ``reshard serve: listening on HOST:PORT ...`` once it serves. SIGTERM (or
Ctrl-C) drains: health turns NOT_SERVING, new calls are refused, calls in flight get
``--grace`` seconds, then the Runtime closes and the process exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import signal
import sys
import threading
from typing import Any

from reshard.cluster import Cluster
from reshard.comm.backend import BackendKind
from reshard.comm.launchers import LauncherKind
from reshard.errors import ClusterError, ReshardBaseError, ReshardError
from reshard.presets import preset_names
from reshard.service.options import (
    DEFAULT_MAX_INLINE,
    DEFAULT_MAX_MESSAGE,
    DEFAULT_PORT,
    MIB,
    ServeOptions,
    TlsFiles,
)

TOKEN_ENV = "RESHARD_SERVICE_TOKEN"
BACKENDS = (*(k.value for k in BackendKind), "none")
"""What ``--backend`` takes: the backends a Runtime starts (:class:`BackendKind`, the
registry's built-ins with launchers), or ``none`` (no Runtime: planning only)."""
_CLUSTER = re.compile(r"(?:(?P<preset>[\w.-]+):)?(?P<hosts>\d+)(?:x(?P<devices>\d+))?")


def parse_cluster(text: str) -> Cluster:
    """``--cluster``: ``HOSTSxDEVICES`` (paper figures), ``PRESET:HOSTS`` (that
    machine, its devices per host), ``PRESET:HOSTSxDEVICES``, or ``@FILE`` holding
    ``Cluster.to_dict()`` as JSON.

    Raises:
        ClusterError: naming the accepted forms.
    """
    if text.startswith("@"):
        try:
            return Cluster.from_dict(json.loads(pathlib.Path(text[1:]).read_text()))
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ClusterError(f"cannot read a cluster from {text[1:]!r}: {e}; the file holds "
                               f"Cluster.to_dict() as JSON") from None
    m = _CLUSTER.fullmatch(text.strip())
    if m is None or (m["preset"] is None and m["devices"] is None):
        raise ClusterError(
            f"bad --cluster {text!r}; use HOSTSxDEVICES (e.g. 4x4), PRESET:HOSTS (e.g. "
            f"dgx-h100:2), PRESET:HOSTSxDEVICES or @cluster.json; presets: "
            f"{list(preset_names())}")
    hosts, devices = int(m["hosts"]), m["devices"] and int(m["devices"])
    if m["preset"] is None:
        return Cluster.regular(hosts, int(devices))
    return Cluster.preset(m["preset"], hosts, int(devices) if devices else None)


_NUMBERS: tuple[tuple[str, type, float, str], ...] = (
    ("--max-message-mb", float, DEFAULT_MAX_MESSAGE / MIB,
     "largest message received or sent, MiB"),
    ("--max-inline-mb", float, DEFAULT_MAX_INLINE / MIB,
     "largest inline array bytes of one Execute request or reply, MiB"),
    ("--workers", int, 8, "threads serving calls"),
    ("--grace", float, 10.0, "seconds calls in flight get to finish on SIGTERM"),
    ("--timeout", float, 60.0, "the Runtime's timeout (a caller's deadline shortens it)"),
    ("--max-plan-cells", int, 1 << 21,
     ("refuse requests whose plan would have more cells (about tasks) than this, before "
      "any work")),
    ("--max-tensors", int, 100_000, "refuse requests of more tensors, counted before any work"),
    ("--max-devices", int, 16_384,
     "refuse requests whose meshes or cluster name more devices, counted before any work"),
    ("--max-estimates", int, 10_000,
     "refuse EstimateMany calls of more requests, before any work"),
    ("--job-workers", int, 2,
     ("processes for expensive requests (stopped at the caller's deadline); fewer than "
      "--workers")),
    ("--job-memory-mb", float, 2048.0, "memory cap of each of those processes, MiB"),
    ("--job-timeout", float, 120.0,
     ("seconds one expensive request's work may take, whatever its deadline (stopped also "
      "when its caller cancels)")),
    ("--max-inflight-mb", float, 256.0,
     ("most memory requests in flight hold at once, MiB (each counts 3 x its size; more are "
      "refused before parsing); at least 3 x --max-message-mb")),
    ("--max-queued-calls", int, 64,
     "calls accepted at once, serving or queued (more are refused)"),
    ("--plan-cache-mb", float, 128.0,
     ("memory of the plans kept for repeated requests, MiB (planned and executable plans: "
      "each cache this much)")),
    ("--answer-cache-mb", float, 32.0,
     ("memory of the EstimateMany answers kept for repeated requests, MiB (error texts "
      "included)")),
    ("--max-search-candidates", int, 100_000,
     "refuse Search calls of more layers, candidates and edges together, before parsing"),
    ("--max-search-cells", int, 1 << 22,
     ("refuse Search calls of more cells (layers' candidates x submesh classes x blocks x "
      "degrees), before any work")),
    ("--search-cache-mb", float, 16.0, "memory of the Search answers kept, MiB"),
)
"""The numeric flags of ``reshard serve`` (the sizes and limits of :class:`ServeOptions`,
the threads and timeouts): ``(flag, type, default, help)``."""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags of ``reshard serve``."""
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default loopback; never a wildcard; other "
                         "addresses need a token)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (0: a free one)")
    ap.add_argument("--backend", default="local", choices=BACKENDS,
                    help="the Runtime's backend for Execute ('none': no Runtime)")
    ap.add_argument("--launcher", default=None, choices=[k.value for k in LauncherKind],
                    help="the Runtime's launcher (default: the backend's)")
    ap.add_argument("--cluster", default=None,
                    help="default cluster of requests without one, and the Runtime's: "
                         "HOSTSxDEVICES, PRESET:HOSTS[xDEVICES] or @cluster.json")
    ap.add_argument("--token-file", default=None,
                    help=f"file holding the token callers must send (or ${TOKEN_ENV})")
    ap.add_argument("--tls-cert", default=None, help="PEM certificate chain: serve TLS")
    ap.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    ap.add_argument("--tls-client-ca", default=None,
                    help="PEM CA: require client certificates signed by it (mutual TLS)")
    ap.add_argument("--insecure", action="store_true",
                    help="serve a non-loopback --host without TLS (the token then crosses "
                         "the network in plaintext); refused without this flag")
    for flag, kind, default, text in _NUMBERS:
        ap.add_argument(flag, type=kind, default=default, help=text)

def _token(path: str | None) -> str | None:
    """The token from ``path``, else from ``$RESHARD_SERVICE_TOKEN``, which is removed
    from this process's environment once read (the processes the server starts, its
    data-plane workers among them, do not inherit it)."""
    from_env = os.environ.pop(TOKEN_ENV, None)
    if path is not None:
        try:
            return pathlib.Path(path).read_text().strip()
        except OSError as e:
            raise ReshardError(f"cannot read --token-file {path!r}: {e.strerror}") from None
    return from_env or None


def token_file_warning(path: str | None) -> str | None:
    """A warning when the token file at ``path`` is readable or writable by others
    than its owner (None when it is not, or there is none)."""
    if path is None:
        return None
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if mode & 0o077:
        return (f"--token-file {path} is open to others (mode {mode & 0o777:o}): anyone "
                f"who can read it can call this server; chmod 600 it")
    return None


def options_from(args: argparse.Namespace) -> ServeOptions:
    """ServeOptions of parsed flags."""
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ReshardError("TLS needs both --tls-cert and --tls-key")
        tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca)
    elif args.tls_client_ca:
        raise ReshardError("--tls-client-ca needs --tls-cert and --tls-key (TLS)")
    return ServeOptions(
        host=args.host, port=args.port,
        backend=None if args.backend == "none" else args.backend, launcher=args.launcher,
        cluster=parse_cluster(args.cluster) if args.cluster else None, token=_token(args.token_file),
        tls=tls, insecure=args.insecure, max_message_bytes=int(args.max_message_mb * MIB),
        max_inline_bytes=int(args.max_inline_mb * MIB), workers=args.workers,
        grace=args.grace, runtime_timeout=args.timeout, max_plan_cells=args.max_plan_cells,
        max_tensors=args.max_tensors, max_devices=args.max_devices,
        max_estimates=args.max_estimates,
        answer_cache_bytes=int(args.answer_cache_mb * MIB),
        job_workers=args.job_workers, job_memory_bytes=int(args.job_memory_mb * MIB),
        job_timeout=args.job_timeout,
        max_inflight_bytes=int(args.max_inflight_mb * MIB),
        max_queued_calls=args.max_queued_calls, plan_cache_bytes=int(args.plan_cache_mb * MIB),
        max_search_candidates=args.max_search_candidates,
        max_search_cells=args.max_search_cells,
        search_cache_bytes=int(args.search_cache_mb * MIB))


MMAP_THRESHOLD = 1 << 20
"""Allocations of at least this many bytes get pages of their own, returned to the
system when freed (glibc's default threshold rises to 32 MiB after the first such free,
after which a burst of large requests leaves the server's heap fragmented: measured 551
vs 378 MB held after 200 distinct 30 MiB requests)."""


def fix_mmap_threshold() -> bool:
    """Pin glibc's mmap threshold at :data:`MMAP_THRESHOLD` for this process; False where
    the C library is not glibc (nothing changes)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    m_mmap_threshold = -3  # glibc's malloc.h
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD))


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM / SIGINT, then drain; 0 on a clean stop, 2 on bad flags."""
    from reshard.service.server import Server

    fix_mmap_threshold()
    warning = token_file_warning(args.token_file)
    if warning:
        print(f"reshard serve: warning: {warning}", file=sys.stderr, flush=True)
    try:
        options = options_from(args)
        server = Server(options).start()
    except ReshardBaseError as e:
        print(f"reshard serve: error: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        print(f"reshard serve: listening on {server.address} (backend "
              f"{options.backend or 'none'}, {'TLS' if options.tls else 'plaintext'}, "
              f"{'token' if options.token else 'no token'})", flush=True)
        while not stop.wait(0.5):
            pass
        print("reshard serve: draining", flush=True)
        server.stop()
        print("reshard serve: stopped", flush=True)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0

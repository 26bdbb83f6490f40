"""The emulated multi-host testbed: Linux network namespaces joined by rate-limited veths.

Every cluster host becomes a network namespace ``rs-<pid>[-<n>]-h<i>`` holding one end
of a veth pair (``rsnic0``, address ``10.213.<k>.<i+2>/24``); the other end
(``rs-<pid>[-<n>]-h<i>`` in the root namespace) is a port of a bridge
(``rs-<pid>[-<n>]-br``, address ``10.213.<k>.1``) that joins all hosts, like a switch.
The NIC's bandwidth is enforced with ``tc`` in both directions: a token bucket
(``tbf``) on the namespace end limits what the host sends, one on the root end limits
what it receives. A host-to-host transfer crosses the sender's egress and the
receiver's ingress bucket: the cost model's ``nic_out`` / ``nic_in`` resources.
Devices of one host talk over the namespace's loopback (unlimited, like the model's
fast intra-host link). An optional ``netem`` delay on the egress end adds one-way
latency.

Workers join it through the process launcher::

    with Testbed(4, nic_gbit_per_s=0.3) as tb:
        with Runtime("gloo", tb.cluster(2), "process", netns=tb) as rt:
            ...

Each worker process enters its host's namespace before anything else (see
:func:`reshard.comm.launchers.netns.enter_netns`); gloo binds to ``rsnic0`` and
advertises the host's address; the driver's rendezvous listens on the bridge address.

Isolation and cleanup: only addresses of a private /24 that no interface of the
machine uses (``10.213.<k>.0/24``, ``k`` picked under a lock so parallel runs differ)
on links this module creates; the root namespace gains only the bridge and its
address. Everything created is recorded as an undo step before the next is made and
removed in reverse order by :meth:`Testbed.close`, which runs at context exit (also
on an exception), at interpreter exit, and on SIGTERM / SIGHUP (turned into
``SystemExit`` so every ``with`` block unwinds): a started testbed arms an
:class:`~reshard.microbench.infra.exit_guard.ExitGuard`, importing this module changes
nothing. Deleting a root-side veth deletes its
peer and both ends' qdiscs. A run killed by SIGKILL leaves names whose pid is dead:
:func:`cleanup_stale` removes them (and ``python -m reshard.testbed
--cleanup`` runs it).

Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), ``ip`` and ``tc`` (iproute2), and kernel
support for namespaces, veth, bridge and tbf (netem for latency); :func:`available`
says whether they are there and, if not, why.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import ipaddress
import os
import re
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from reshard.comm.launchers.netns import NETNS_DIR, NetnsHost, NetnsPlacement
from reshard.core.cliargs import add_version
from reshard.core.cluster import Cluster
from reshard.core.helptext import for_terminal
from reshard.microbench.infra.exit_guard import Guarded
from reshard.microbench.infra.host_net import (
    NS_IFNAME,
    STATE_DIR,
    Availability,
    TestbedError,
    available,
    cleanup_stale,
    in_netns,
    links,
    locked,
    namespaces,
    qdisc_devices,
    run_ip,
    start_time,
    tag_of,
)

SUBNET_PREFIX = "10.213"  # subnets 10.213.<k>.0/24
_IFNAMSIZ = 15  # longest link name
_MAX_HOSTS = 250
MTU = 1500
"""Every veth's MTU (set when it is made; the bridge takes its ports')."""
_ETHERNET_HEADER = 14  # counted by tc on a veth
_TCP_IP_HEADERS = 20 + 20 + 12  # IPv4, TCP, TCP timestamps (on by default in a netns)


# ----- the testbed ---------------------------------------------------------------------
class Testbed(Guarded):
    """``num_hosts`` emulated hosts whose NICs carry ``nic_gbit_per_s`` each way.

    Args:
        num_hosts: hosts (network namespaces) to create.
        nic_gbit_per_s: NIC rate in Gbit/s (10^9 bit/s), enforced in each direction.
        latency_ms: one-way delay added to every packet a host sends (netem), 0 for none.
        burst_bytes: token bucket depth; default max(128 KiB, 2 ms at the rate), enough
            for a 64 KiB GSO segment (smaller buckets cost CPU on every packet).
        queue_ms: bytes a bucket queues before dropping, in milliseconds at the rate
            (TCP needs some; default 20 ms, at least 4 buckets).

    Use as a context manager (or call :meth:`start` and :meth:`close`).
    """

    __test__ = False  # not a pytest test class
    available = staticmethod(available)  # Testbed.available(): can one be built here?

    def __init__(self, num_hosts: int, nic_gbit_per_s: float, latency_ms: float = 0.0, *,
                 burst_bytes: int | None = None, queue_ms: float = 20.0) -> None:
        if not 1 <= int(num_hosts) <= _MAX_HOSTS:
            raise TestbedError(f"num_hosts must be 1..{_MAX_HOSTS}, got {num_hosts}")
        if not nic_gbit_per_s > 0:
            raise TestbedError(f"nic_gbit_per_s must be > 0, got {nic_gbit_per_s}")
        if not latency_ms >= 0:
            raise TestbedError(f"latency_ms must be >= 0, got {latency_ms}")
        self.num_hosts = int(num_hosts)
        self.nic_gbit_per_s = float(nic_gbit_per_s)
        self.latency_ms = float(latency_ms)
        self.rate_bits = round(self.nic_gbit_per_s * 1e9)
        rate_bytes = self.rate_bits / 8
        self.burst_bytes = int(burst_bytes or max(128 * 1024, rate_bytes * 0.002))
        self.limit_bytes = int(max(4 * self.burst_bytes, rate_bytes * queue_ms / 1000))
        self.tag = ""
        self.subnet: ipaddress.IPv4Network | None = None
        self._undo: list[tuple[str, Callable[[], Any]]] = []
        super().__init__("testbed")

    # ----- names -----------------------------------------------------------------------
    @property
    def nic_bandwidth(self) -> float:
        """The NIC rate in bytes/s: whole frames on the wire, what tc limits."""
        return self.rate_bits / 8

    @property
    def payload_bandwidth(self) -> float:
        """TCP payload bytes/s a saturated NIC carries (what :meth:`cluster` gives the
        cost model): tc counts whole frames, and a full segment of ``MTU - 52`` payload
        bytes (IPv4, TCP and its timestamp option) is a frame of ``MTU + 14`` (1448 of
        1514 bytes at MTU 1500: 95.6%; measured 4.76% more bytes on the wire than the
        plan moves, the receivers' acknowledgements included)."""
        return self.nic_bandwidth * (MTU - _TCP_IP_HEADERS) / (MTU + _ETHERNET_HEADER)

    def netns(self, host: int) -> str:
        """Name of host ``host``'s network namespace (``ip netns exec NAME ...``)."""
        return f"{self.tag}-h{self._check_host(host)}"

    def link(self, host: int) -> str:
        """Name of host ``host``'s veth end in the root namespace (its ingress limit)."""
        return f"{self.tag}-h{self._check_host(host)}"

    @property
    def bridge(self) -> str:
        """Name of the bridge in the root namespace."""
        return f"{self.tag}-br"

    @property
    def ifname(self) -> str:
        """The NIC's name inside every host namespace."""
        return NS_IFNAME

    def address(self, host: int) -> str:
        """Host ``host``'s IPv4 address (inside its namespace)."""
        self._check_started()
        assert self.subnet is not None
        return str(self.subnet.network_address + 2 + self._check_host(host))

    @property
    def driver_address(self) -> str:
        """The bridge's address in the root namespace (where the driver listens)."""
        self._check_started()
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    def names(self) -> dict[str, list[str]]:
        """What this testbed creates: ``{"netns": [...], "links": [...]}`` (root namespace
        links; the namespaces' ``rsnic0`` ends go with them)."""
        return {"netns": [self.netns(h) for h in range(self.num_hosts)],
                "links": [self.link(h) for h in range(self.num_hosts)] + [self.bridge]}

    def _check_host(self, host: int) -> int:
        if not self.tag:
            raise TestbedError("the testbed is not started (use it as a context manager)")
        if not 0 <= int(host) < self.num_hosts:
            raise TestbedError(f"host {host} out of range: the testbed has hosts "
                               f"0..{self.num_hosts - 1}")
        return int(host)

    def _check_started(self) -> None:
        if not self._started or self._closed:
            raise TestbedError("the testbed is not running (use it as a context manager)")

    # ----- what reshard uses -----------------------------------------------------------
    def cluster(self, devices_per_host: int, *, preset: str = "paper",
                num_hosts: int | None = None, **overrides: float) -> Cluster:
        """A :class:`Cluster` of this testbed's hosts (or the first ``num_hosts``), device
        ids host-major, whose ``nic_bandwidth`` is the TCP payload rate the tc rate
        leaves (:attr:`payload_bandwidth`) and, with ``latency_ms``,
        whose ``latency`` is the netem delay; its relays hold gloo's pipelining piece
        before passing it on (``relay_piece``: the testbed runs gloo workers). Other
        figures come from ``preset`` unless given in ``overrides``."""
        n = self.num_hosts if num_hosts is None else int(num_hosts)
        if not 1 <= n <= self.num_hosts:
            raise TestbedError(f"num_hosts must be 1..{self.num_hosts}, got {num_hosts}")
        from reshard.comm.backends.gloo import CHAIN_PIECE

        figures: dict[str, Any] = {"nic_bandwidth": self.payload_bandwidth,
                                   "relay_piece": CHAIN_PIECE,
                                   "name": f"testbed {self.nic_gbit_per_s:g} Gbit/s"}
        if self.latency_ms:
            figures["latency"] = self.latency_ms / 1000
        figures.update(overrides)
        return Cluster.regular(n, devices_per_host, preset=preset, **figures)

    def netns_placement(self) -> NetnsPlacement:
        """Where the process launcher puts each host's workers (``Runtime(netns=tb)``)."""
        self._check_started()
        return NetnsPlacement(
            tuple(NetnsHost(self.netns(h), self.address(h), NS_IFNAME)
                  for h in range(self.num_hosts)), self.driver_address)

    @contextlib.contextmanager
    def entered(self, host: int) -> Iterator[None]:
        """Run the body with the calling thread inside host ``host``'s namespace (sockets
        made there belong to it, and keep doing so afterwards), then move it back."""
        self._check_started()
        with in_netns(self.netns(host)):
            yield

    def measure(self, src: int, dst: int, nbytes: int, timeout: float = 60.0) -> float:
        """Seconds to send ``nbytes`` over one TCP connection from host ``src`` to host
        ``dst`` (until the receiver has them all and says so). ``src == dst`` measures
        the namespace's loopback."""
        with self.entered(dst):
            server = socket.create_server((self.address(dst), 0))
        with self.entered(src):
            client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.settimeout(timeout)
        client.settimeout(timeout)
        errors: list[BaseException] = []

        def receive() -> None:
            try:
                conn, _ = server.accept()
                with conn:
                    conn.settimeout(timeout)
                    left = nbytes
                    buf = bytearray(1 << 20)
                    while left:
                        got = conn.recv_into(buf, min(left, len(buf)))
                        if not got:
                            raise ConnectionError(f"sender closed with {left} bytes left")
                        left -= got
                    conn.sendall(b"k")
            except BaseException as e:  # noqa: BLE001 - reported by the caller
                errors.append(e)

        th = threading.Thread(target=receive, name="testbed-receive", daemon=True)
        th.start()
        try:
            client.connect((self.address(dst), server.getsockname()[1]))
            chunk = memoryview(bytes(min(nbytes, 1 << 20)) or b"\0")
            t0 = time.perf_counter()
            left = nbytes
            while left:
                n = min(left, len(chunk))
                client.sendall(chunk[:n])
                left -= n
            if client.recv(1) != b"k":
                raise TestbedError("receiver did not acknowledge")
            seconds = time.perf_counter() - t0
        finally:
            client.close()
            th.join(timeout)
            server.close()
        if errors:
            raise TestbedError(f"receiving on host {dst} failed: {errors[0]}")
        return seconds

    # ----- lifecycle (and a with block: Guarded's) -----------------------------------
    def start(self) -> Testbed:
        """Create namespaces, bridge, veths, addresses and qdiscs."""
        if self._started:
            raise TestbedError("the testbed was started already; make a new one")
        ok = available(latency=self.latency_ms > 0)
        if not ok:
            raise TestbedError(f"cannot build a network-namespace testbed here: {ok.reason}")
        self._begin()  # close at exit and on SIGTERM / SIGHUP, from now on
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _do(self, argv: Sequence[str], undo: Sequence[str] | None, what: str) -> None:
        """Run a command; if it made something, remember how to remove it."""
        run_ip(*argv)
        if undo is not None:
            self._undo.append((what, functools.partial(run_ip, *undo, check=False)))

    def _pick_tag(self) -> str:
        pid = os.getpid()
        taken = {t for n in links() + namespaces() if (t := (tag_of(n) or (0, ""))[1])}
        for n in range(1000):
            tag = f"rs-{pid}" + (f"-{n}" if n else "")
            if tag not in taken and len(f"{tag}-h{self.num_hosts - 1}") <= _IFNAMSIZ:
                return tag
        raise TestbedError(f"no free testbed name for pid {pid} (link names are limited "
                           f"to {_IFNAMSIZ} characters)")

    def _pick_subnet(self) -> ipaddress.IPv4Network:
        used = []
        for line in run_ip("ip", "-o", "-4", "addr", "show").stdout.splitlines() + \
                run_ip("ip", "-4", "route", "show", "table", "all").stdout.splitlines():
            for m in re.finditer(r"\b(\d+\.\d+\.\d+\.\d+)(/\d+)?\b", line):
                with contextlib.suppress(ValueError):
                    used.append(ipaddress.ip_network(m.group(0), strict=False))
        for k in range(256):
            net = ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{k}.0/24")
            if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
                return net
        raise TestbedError(f"every subnet {SUBNET_PREFIX}.0-255.0/24 is in use")

    def _build(self) -> None:
        with locked():
            cleanup_stale()
            self.tag = self._pick_tag()
            record = os.path.join(STATE_DIR, self.tag)
            with open(record, "w") as f:
                f.write(f"{os.getpid()} {start_time(os.getpid())}\n")
            self._undo.append(("record", functools.partial(_unlink, record)))
            self.subnet = self._pick_subnet()
            br = self.bridge
            self._do(["ip", "link", "add", "name", br, "type", "bridge"],
                     ["ip", "link", "del", br], f"bridge {br}")
            # A bridge of our own: no netfilter on it, no IPv6 addresses, no STP delay.
            run_ip("ip", "link", "set", br, "type", "bridge", "nf_call_iptables", "0",
                 "nf_call_ip6tables", "0", "nf_call_arptables", "0", check=False)
            run_ip("ip", "link", "set", br, "addrgenmode", "none", check=False)
            self._do(["ip", "addr", "add", f"{self.driver_address}/{self.subnet.prefixlen}",
                      "dev", br], None, "")
            self._do(["ip", "link", "set", br, "up"], None, "")
        for h in range(self.num_hosts):
            self._build_host(h)

    def _build_host(self, h: int) -> None:
        ns, root_end = self.netns(h), self.link(h)
        # Undo steps run in reverse: the veth (and its peer and qdiscs) goes before the
        # namespace, the namespace before the bridge.
        self._do(["ip", "netns", "add", ns], ["ip", "netns", "del", ns], f"netns {ns}")
        self._do(["ip", "link", "add", root_end, "mtu", str(MTU), "type", "veth", "peer",
                  "name", NS_IFNAME, "netns", ns, "mtu", str(MTU)],
                 ["ip", "link", "del", root_end], f"veth {root_end}")
        for argv in (
            ["ip", "link", "set", root_end, "addrgenmode", "none"],
            ["ip", "-n", ns, "link", "set", NS_IFNAME, "addrgenmode", "none"],
        ):
            run_ip(*argv, check=False)
        assert self.subnet is not None
        for argv in (
            ["ip", "link", "set", root_end, "master", self.bridge],
            ["ip", "link", "set", root_end, "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "-n", ns, "addr", "add", f"{self.address(h)}/{self.subnet.prefixlen}",
             "dev", NS_IFNAME],
            ["ip", "-n", ns, "link", "set", NS_IFNAME, "up"],
        ):
            self._do(argv, None, "")
        tbf = ["tbf", "rate", f"{self.rate_bits}bit", "burst", str(self.burst_bytes),
               "limit", str(self.limit_bytes)]
        if self.latency_ms:  # egress: delay, then the bucket
            self._do(["tc", "-n", ns, "qdisc", "add", "dev", NS_IFNAME, "root", "handle",
                      "1:", "netem", "delay", f"{self.latency_ms}ms", "limit", "100000"],
                     None, "")
            self._do(["tc", "-n", ns, "qdisc", "add", "dev", NS_IFNAME, "parent", "1:1",
                      "handle", "10:", *tbf], None, "")
        else:
            self._do(["tc", "-n", ns, "qdisc", "add", "dev", NS_IFNAME, "root", *tbf],
                     None, "")
        self._do(["tc", "qdisc", "add", "dev", root_end, "root", *tbf], None, "")

    def close(self) -> None:
        """Remove everything this testbed created (idempotent; safe to re-run after an
        interruption: finished steps are not repeated). Warns about what remains."""
        with self._lock:
            if self._nothing_to_close():
                return
            failed = []
            while self._undo:
                what, step = self._undo[-1]
                try:
                    step()
                except Exception as e:  # noqa: BLE001 - keep removing the rest
                    failed.append(f"{what}: {e}")
                self._undo.pop()  # not reached on KeyboardInterrupt/SystemExit: re-run
            self._closed = True
        self._guard.disarm()
        left = self.leftovers() + failed
        if left:
            warnings.warn(f"testbed {self.tag}: could not remove {left}; run "
                          f"`python -m reshard.testbed --cleanup`", RuntimeWarning,
                          stacklevel=2)

    def leftovers(self) -> list[str]:
        """Namespaces, links and qdiscs of this testbed that exist now (after
        :meth:`close`: none)."""
        if not self.tag:
            return []
        names = self.names()
        out = [f"netns {n}" for n in namespaces() if n in names["netns"]]
        out += [f"link {n}" for n in links() if n in names["links"]]
        out += [f"qdisc on {n}" for n in qdisc_devices() if n in names["links"]]
        out += [f"file {p}" for n in names["netns"]
                if os.path.exists(p := os.path.join(NETNS_DIR, n))]
        return sorted(set(out))

    def __repr__(self) -> str:
        return (f"Testbed({self.num_hosts}, nic_gbit_per_s={self.nic_gbit_per_s:g}, "
                f"latency_ms={self.latency_ms:g}) [{self.tag or '-'} {self.subnet or ''} "
                f"{self._state()}]")


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


# ----- command line --------------------------------------------------------------------
def selftest(nic_gbit_per_s: float = 0.3, seconds: float = 0.5, runs: int = 3) -> int:
    """Measure the achieved rate between two namespaces and print it; 0 if within
    0.7x..1.1x of the tc rate."""
    ok = available()
    if not ok:
        print(f"testbed unavailable: {ok.reason}")
        return 2
    with Testbed(2, nic_gbit_per_s) as tb:
        nbytes = int(tb.nic_bandwidth * seconds)
        print(f"{tb!r}: {tb.address(0)} -> {tb.address(1)}, tbf rate "
              f"{tb.rate_bits / 1e6:g} Mbit/s, burst {tb.burst_bytes} B, queue "
              f"{tb.limit_bytes} B")
        loop = tb.measure(0, 0, 64 << 20)
        print(f"  loopback inside h0: {(64 << 20) / loop / 1e9:.2f} GB/s")
        ratios = []
        for i in range(runs):
            t = tb.measure(0, 1, nbytes)
            rate = nbytes / t
            ratios.append(rate / tb.nic_bandwidth)
            print(f"  run {i}: {nbytes / 1e6:.1f} MB in {t * 1e3:.1f} ms = "
                  f"{rate * 8 / 1e6:.1f} Mbit/s ({ratios[-1]:.3f} x the tc rate; model "
                  f"time {nbytes / tb.nic_bandwidth * 1e3:.1f} ms)")
    best = max(ratios)
    print(f"achieved {best:.3f} x the configured rate (best of {runs})")
    return 0 if 0.7 <= best <= 1.1 else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``--selftest``: measure a link; ``--cleanup``: remove stale testbeds;
    ``--check``: say whether testbeds can be built here."""
    ap = argparse.ArgumentParser(prog="python -m reshard.testbed",
                                 description=for_terminal(__doc__).split("\n\n")[0])
    add_version(ap)
    ap.add_argument("--selftest", action="store_true",
                    help="measure the achieved TCP rate between two namespaces")
    ap.add_argument("--cleanup", action="store_true",
                    help="remove leftovers of testbeds whose process is gone")
    ap.add_argument("--check", action="store_true", help="print whether testbeds work here")
    ap.add_argument("--gbit", type=float, default=0.3, help="NIC rate for --selftest")
    ap.add_argument("--seconds", type=float, default=0.5, help="transfer length for --selftest")
    args = ap.parse_args(argv)
    rc = 0
    if args.check or not (args.selftest or args.cleanup):
        ok = available()
        print(f"available: {ok.ok} ({ok.reason})")
        rc = 0 if ok else 2
    if args.cleanup:
        if os.geteuid() != 0:
            print("--cleanup needs root")
            return 2
        removed = cleanup_stale(verbose=True)
        print(f"removed {len(removed)} stale item(s)")
    if args.selftest:
        rc = selftest(args.gbit, args.seconds)
    return rc


__all__ = ["Availability", "Testbed", "TestbedError", "available", "cleanup_stale", "main",
           "selftest"]

if __name__ == "__main__":
    sys.exit(main())

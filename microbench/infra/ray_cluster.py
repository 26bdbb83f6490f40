"""A real multi-node Ray cluster on the emulated testbed: one Ray node per host namespace.

Every testbed host (a network namespace, :mod:`reshard.testbed`) runs one
Ray node, started with ``ray start --block`` inside the namespace: host 0 the head
(GCS at ``<host 0 address>:6379``), every other host a worker node joining it by that
address, each with ``--node-ip-address`` = its namespace's address. Nodes of different
hosts talk only over the hosts' tc-limited veths, as do the gloo workers that reshard's
Ray launcher starts on them (:mod:`reshard.comm.launchers.ray`: one actor per device,
pinned to the node of its cluster host). The calling process becomes the cluster's
driver on the head node: it joins by address from inside host 0's namespace (the
thread that calls :meth:`RayCluster.start` enters it for ``ray.init`` and comes back,
Ray's own threads and sockets stay there)::

    with Testbed(3, nic_gbit_per_s=0.5) as tb, RayCluster(tb) as rc:
        with Runtime("gloo", tb.cluster(2), "ray", address=rc.address) as rt:
            ...

Security: Ray's token authentication stays on. A random 256-bit token is written to a
file only root can read (mode 0600, in a 0700 directory of this cluster) and handed to
every node and to the driver as ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH``;
a node or driver without it is refused by the GCS. Ray's processes listen inside the
namespaces only (their wildcard binds reach no interface of the machine).

Lean: no dashboard, no log monitor, no usage stats, no CPUs (reshard's actors ask for
none, so no idle workers are prestarted), a small object store
(``RayClusterOptions.object_store_bytes``), no drain wait at shutdown. What Ray starts
regardless: per node a raylet, a dashboard agent (minimal) and a runtime-env agent; on
the head also the GCS, the autoscaler monitor, the API server and the client server
(about 420 MiB per node). Actors run at normal CPU priority, like the process
launcher's workers: Ray renices its workers to 15, which on a node of their own only
yields to the node's Ray processes, but on the one machine all emulated hosts share
would yield to everything else too.

Teardown: :meth:`RayCluster.close` disconnects the driver, stops the worker nodes then
the head (SIGTERM to each ``ray start --block``, which stops its node's processes; then
SIGKILL to whatever of its process tree is left) and removes the cluster's directory
(token, logs). It runs at context exit (also on an exception), at interpreter exit, and
on SIGTERM / SIGHUP (an :class:`~reshard.microbench.infra.exit_guard.ExitGuard`, as the
testbed's); a watchdog (:func:`reshard.comm.launchers.raywatch.watch_ray`) stops the
nodes should the driver die by SIGKILL. Close the cluster before its testbed (nested
``with`` blocks do).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import IO, Any, Self

from reshard.comm.launchers.netns import enter_netns
from reshard.comm.launchers.raywatch import process_tree, watch_ray
from reshard.microbench.infra.exit_guard import Guarded
from reshard.testbed import Testbed, TestbedError

_ENTRY = "from reshard.microbench.infra.ray_cluster import exec_in_netns; exec_in_netns()"
_RAY_CLI = ("-m", "ray.scripts.scripts")
# Ray settings of every node and of the driver: token authentication on, nothing that
# phones home, no drain wait when a node is stopped, and workers (reshard's actors) at
# normal CPU priority: Ray renices them to 15, harmless on a machine of their own but a
# handicap against everything else on the one machine the testbed's hosts share.
_RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "RAY_worker_niceness": "0"}
# Variables of the caller's environment that would point a node or the driver at
# another cluster or another token.
_FOREIGN = ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


class RayClusterError(TestbedError):
    """A Ray node could not be started or did not join (the message quotes its log)."""

    __test__ = False


@dataclasses.dataclass(frozen=True)
class RayClusterOptions:
    """How the nodes are started.

    Attributes:
        gcs_port: the head's GCS port (inside host 0's namespace; every namespace has
            its own ports, so the default never collides with another Ray).
        object_store_bytes: each node's object store (Ray's minimum is 75 MiB).
        start_timeout: seconds for all nodes to start and join.
        stop_grace: seconds a node gets to stop after SIGTERM before SIGKILL.
    """

    gcs_port: int = 6379
    object_store_bytes: int = 96 * 2**20
    start_timeout: float = 90.0
    stop_grace: float = 10.0


def _ray_reading_env() -> Any:
    """The ``ray`` module, its configuration read from the environment now.

    Ray reads ``RAY_AUTH_MODE`` (and its other settings) once, when it is imported, and
    caches the token it loads: importing it after the variables are set is enough;
    if it was imported before, both are read again the way Ray itself does when it
    turns token authentication on for a local cluster.
    """
    imported = "ray" in sys.modules
    try:
        import ray
    except ModuleNotFoundError as e:
        raise RayClusterError("a RayCluster needs Ray, which is not installed: pip "
                              "install 'reshard[ray]'") from e

    try:
        from ray._raylet import (  # type: ignore[attr-defined]  # not in its stub
            AuthenticationMode,
            AuthenticationTokenLoader,
            Config,
            get_authentication_mode,
        )
    except ImportError as e:
        raise RayClusterError(
            f"Ray {ray.__version__} has no token authentication (RAY_AUTH_MODE); a "
            f"RayCluster keeps it on, so it needs Ray >= 2.52: pip install -U 'ray>=2.52'"
        ) from e
    if imported:
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    if get_authentication_mode() != AuthenticationMode.TOKEN:
        raise RayClusterError(
            "Ray did not turn token authentication on for the driver although "
            "RAY_AUTH_MODE=token is set; connect from a fresh process")
    return ray


def exec_in_netns() -> None:
    """``python -c _ENTRY NETNS PROGRAM ARG...``: enter the namespace, then exec."""
    netns, *argv = sys.argv[1:]
    enter_netns(netns, sysfs=True)  # a fresh interpreter has one thread: it all moves
    os.execv(argv[0], argv)


class RayCluster(Guarded):
    """Ray nodes on the first ``num_hosts`` hosts of a started testbed, this process
    their driver.

    Args:
        testbed: a started :class:`~reshard.testbed.Testbed`.
        num_hosts: hosts that get a node (default: all of the testbed's).
        options: how nodes are started.

    Use as a context manager (or call :meth:`start` and :meth:`close`).
    """

    __test__ = False

    def __init__(self, testbed: Testbed, num_hosts: int | None = None,
                 options: RayClusterOptions = RayClusterOptions()) -> None:
        n = testbed.num_hosts if num_hosts is None else int(num_hosts)
        if not 1 <= n <= testbed.num_hosts:
            raise RayClusterError(
                f"num_hosts must be 1..{testbed.num_hosts} (the testbed's hosts), got "
                f"{num_hosts}; build a larger Testbed or ask for fewer nodes")
        self.testbed = testbed
        self.num_hosts = n
        self.options = options
        self.directory = ""
        self._nodes: dict[int, subprocess.Popen] = {}
        self._logs: dict[int, IO[str]] = {}
        self._node_ids: dict[int, str] = {}
        self._watchdog: subprocess.Popen | None = None
        self._saved_env: dict[str, str | None] = {}
        self._connected = False
        super().__init__("ray cluster")

    # ----- facts -----------------------------------------------------------------------
    @property
    def address(self) -> str:
        """The head's GCS address, ``host:port`` (what nodes and the driver join)."""
        return f"{self.testbed.address(0)}:{self.options.gcs_port}"

    @property
    def token_path(self) -> str:
        """The file holding the cluster's authentication token (mode 0600)."""
        return os.path.join(self.directory, "auth_token")

    @property
    def node_ids(self) -> dict[int, str]:
        """Ray node id of every host's node."""
        return dict(self._node_ids)

    def node_env(self) -> dict[str, str]:
        """The environment a node (or the driver) of this cluster runs with: this
        process's, less what points at another cluster or token, plus the Ray settings
        and the token's path."""
        env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
        env.update(_RAY_ENV)
        env["RAY_AUTH_TOKEN_PATH"] = self.token_path
        return env

    def ray_start(self, host: int, *, head: bool) -> list[str]:
        """The ``ray start --block`` command line of ``host``'s node."""
        tb, o = self.testbed, self.options
        argv = [sys.executable, *_RAY_CLI, "start", "--block",
                f"--node-ip-address={tb.address(host)}", "--num-cpus=0", "--num-gpus=0",
                f"--object-store-memory={o.object_store_bytes}",
                "--include-log-monitor=false", "--disable-usage-stats",
                f"--temp-dir={os.path.join(self.directory, f'h{host}')}"]
        if head:
            argv += ["--head", f"--port={o.gcs_port}", "--include-dashboard=false"]
        else:
            argv += [f"--address={self.address}"]
        return argv

    def pids(self, host: int | None = None) -> set[int]:
        """Processes of ``host``'s node (all nodes: None) that are alive now: the
        ``ray start`` process and its tree (GCS, raylet, agents, workers, actors)."""
        hosts = self._nodes if host is None else [host]
        return process_tree([self._nodes[h].pid for h in hosts if h in self._nodes])

    def raylet_pid(self, host: int) -> int:
        """The raylet of ``host``'s node."""
        for pid in self.pids(host):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "raylet":
                    return pid
        raise RayClusterError(f"host {host}'s node has no raylet process (stopped or "
                              f"crashed; see {self.log_path(host)})")

    def log_path(self, host: int) -> str:
        """Where ``host``'s ``ray start`` writes its output."""
        return os.path.join(self.directory, f"node-h{host}.log")

    # ----- lifecycle (and a with block: Guarded's) -----------------------------------
    def start(self) -> Self:
        """Start the head, then the other nodes, connect this process as the driver and
        wait until every node has joined."""
        if self._started:
            raise RayClusterError("this RayCluster was started already; make a new one")
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            raise RayClusterError(
                "this process is already connected to a Ray cluster; a RayCluster makes "
                "this process its driver: call ray.shutdown() first or use a fresh process")
        self.testbed.netns(0)  # raises unless the testbed runs
        self._begin()
        try:
            self.directory = tempfile.mkdtemp(prefix=f"{self.testbed.tag}-ray-")
            os.chmod(self.directory, 0o700)
            fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
            deadline = time.monotonic() + self.options.start_timeout
            self._spawn(0, head=True)
            self._wait_for_gcs(deadline)
            for h in range(1, self.num_hosts):
                self._spawn(h, head=False)
            self._watchdog = watch_ray(os.getpid(), [p.pid for p in self._nodes.values()])
            self._connect()
            self._wait_for_nodes(deadline)
        except BaseException:
            self.close()
            raise
        return self

    def _spawn(self, host: int, *, head: bool) -> None:
        log = open(self.log_path(host), "w")  # noqa: SIM115 - closed by close()
        self._logs[host] = log
        self._nodes[host] = subprocess.Popen(
            [sys.executable, "-c", _ENTRY, self.testbed.netns(host),
             *self.ray_start(host, head=head)],
            env=self.node_env(), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)

    def _check_nodes_running(self) -> None:
        for h, proc in self._nodes.items():
            if proc.poll() is not None:
                raise RayClusterError(
                    f"the Ray node of host {h} exited with code {proc.returncode} while "
                    f"starting: {self._log_tail(h)}")

    def _log_tail(self, host: int, lines: int = 6) -> str:
        with contextlib.suppress(OSError):
            with open(self.log_path(host)) as f:
                text = [ln for ln in f.read().splitlines() if ln.strip()]
            return " | ".join(text[-lines:]) + f" (log: {self.log_path(host)})"
        return f"(no log at {self.log_path(host)})"

    def _wait_for_gcs(self, deadline: float) -> None:
        """Until the head's GCS accepts connections (over the bridge)."""
        while True:
            self._check_nodes_running()
            gcs = (self.testbed.address(0), self.options.gcs_port)
            with contextlib.suppress(OSError), socket.create_connection(gcs, timeout=1.0):
                return
            if time.monotonic() > deadline:
                raise RayClusterError(
                    f"the head's GCS at {self.address} did not come up within "
                    f"{self.options.start_timeout:g}s: {self._log_tail(0)}")
            time.sleep(0.2)

    def _connect(self) -> None:
        """``ray.init`` by address as a driver on the head node, with the token."""
        env = self.node_env()
        for k in (*_FOREIGN, *_RAY_ENV):
            self._saved_env.setdefault(k, os.environ.get(k))
            if k in env:
                os.environ[k] = env[k]
            else:
                os.environ.pop(k, None)
        ray = _ray_reading_env()
        with self.testbed.entered(0):
            ray.init(address=self.address, _node_ip_address=self.testbed.address(0),
                     log_to_driver=False)
        self._connected = True
        self._guard.reclaim()  # ray.init replaced the SIGTERM handler

    def _wait_for_nodes(self, deadline: float) -> None:
        """Until every host's node is alive in the GCS; records the node ids."""
        import ray

        want = {self.testbed.address(h): h for h in range(self.num_hosts)}
        while True:
            self._check_nodes_running()
            alive = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes()
                     if n.get("Alive")}
            if set(want) <= set(alive):
                self._node_ids = {h: alive[a] for a, h in want.items()}
                return
            if time.monotonic() > deadline:
                missing = sorted(h for a, h in want.items() if a not in alive)
                raise RayClusterError(
                    f"Ray nodes of hosts {missing} did not join {self.address} within "
                    f"{self.options.start_timeout:g}s: "
                    + "; ".join(self._log_tail(h) for h in missing))
            time.sleep(0.2)

    def close(self) -> None:
        """Disconnect the driver, stop every node, remove the cluster's directory
        (idempotent)."""
        with self._lock:
            if self._nothing_to_close():
                return
            self._closed = True
        try:
            if self._connected:
                import ray

                with contextlib.suppress(Exception):
                    ray.shutdown()
                self._connected = False
            for h in sorted(self._nodes, reverse=True):  # worker nodes first, head last
                self._stop(h)
            if self._watchdog is not None:
                self._watchdog.kill()
                self._watchdog.wait()
            for log in self._logs.values():
                log.close()
            for k, v in self._saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            if self.directory:
                shutil.rmtree(self.directory, ignore_errors=True)
        finally:
            self._guard.disarm()

    def _stop(self, host: int) -> None:
        """SIGTERM the node's ``ray start`` (it stops its processes), then SIGKILL
        whatever of its tree is left."""
        proc = self._nodes[host]
        tree = self.pids(host)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(self.options.stop_grace)
        tree |= process_tree(tree)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait()

    def __repr__(self) -> str:
        return f"RayCluster({self.num_hosts} nodes at {self.address}) [{self._state()}]"


def join_as_stranger(cluster: RayCluster, host: int, token: str | None = None,
                     timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run ``ray start --address=...`` for a second node in ``host``'s namespace that
    lacks the cluster's token: none at all (``token=None``: Ray's default mode, no
    token file in its home) or a wrong one. Returns the finished ``ray start``; a
    refused node exits non-zero (a node that joined is killed at once).

    Raises:
        RayClusterError: ``ray start`` neither joined nor gave up within ``timeout``.
    """
    home = tempfile.mkdtemp(prefix="stranger-", dir=cluster.directory)
    argv = [sys.executable, "-c", _ENTRY, cluster.testbed.netns(host), sys.executable,
            *_RAY_CLI, "start", f"--address={cluster.address}",
            f"--node-ip-address={cluster.testbed.address(host)}", "--num-cpus=0",
            f"--object-store-memory={cluster.options.object_store_bytes}",
            f"--temp-dir={os.path.join(home, 'ray')}"]
    env = {k: v for k, v in cluster.node_env().items()
           if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}
    env["HOME"] = home  # no ~/.ray/auth_token of the caller's
    env["RAY_gcs_server_port_wait_time_s"] = "2"  # give up after ~2 refused attempts
    if token is not None:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    try:
        proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise RayClusterError(f"a node without the token neither joined {cluster.address} "
                              f"nor gave up within {timeout:g}s") from e
    if proc.returncode == 0:  # joined (security is off): kill what it left in the netns
        ours = cluster.pids()
        listed = subprocess.run(["ip", "netns", "pids", cluster.testbed.netns(host)],
                                capture_output=True, text=True, check=False).stdout.split()
        for pid in {int(p) for p in listed} - ours:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return proc


__all__ = ["RayCluster", "RayClusterError", "RayClusterOptions", "exec_in_netns",
           "join_as_stranger"]

"""Ray launcher: one actor per device, each hosting a backend rank and a DeviceWorker.

* Ray itself: joined at ``address`` (``"auto"``, ``"ray://host:port"``) when given,
  else an embedded local cluster (``ray.init()``) unless this process is already
  connected. The launcher never shuts Ray down (the process may use it for more), but
  an embedded Ray it started goes with the driver, even a killed one
  (:mod:`reshard.comm.launchers.raywatch`).
* Actors ask for no CPU (``num_cpus=0``), so eight or more fit a small machine; nccl
  actors ask for one GPU each (Ray then sets ``CUDA_VISIBLE_DEVICES``) unless ``env``
  pins ``CUDA_VISIBLE_DEVICES`` itself.
* Placement: when the Cluster has several hosts and Ray several alive nodes, cluster
  host ``i`` (in order of first device) goes to node ``i`` (nodes sorted by IP
  address, numerically; for nccl actors that ask for a GPU only nodes with GPUs count;
  round-robin when there are fewer nodes than hosts), pinned with a hard
  ``NodeAffinitySchedulingStrategy``: an actor never runs on another node than its
  host's (on the emulated testbed, host ``h``'s node has the ``h``-th address). Node
  affinity rather than a custom resource per host because it needs nothing from
  ``ray start`` (an existing cluster works as it is) and cannot match two nodes.
  Otherwise Ray places the actors (one node: all on it).
* Rendezvous: a small async actor (:class:`RayRendezvous`), reachable from every
  actor even when the driver is a Ray client.
* Not ``ray.util.collective``: its gloo groups hang when a process is in two groups,
  and one group per backend per actor does not fit a plan's many member sets. The
  actors run torch.distributed / cupy.nccl themselves.

Faults: a call on a dead actor fails with ``RayActorError``, turned into
:class:`~reshard.ExecutionError` naming the device; :meth:`RayGroup.dead` also checks
the pid of every actor on the driver's machine (same boot and pid namespace: the
driver's node, or every node of the emulated testbed). A raylet that dies takes its
actors with it a few seconds later (Ray's workers exit once their raylet is gone);
their gloo peers fail at once with errors naming them. :meth:`RayGroup.close` kills
every actor (``ray.kill``) and waits, bounded, until the processes of those on the
driver's machine are gone; it also runs at interpreter exit.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import ipaddress
import logging
import os
import signal
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from reshard.comm.backend import BackendKind
from reshard.comm.launchers.base import require_workers
from reshard.comm.launchers.cleanup import close_at_exit
from reshard.comm.launchers.host import WorkerHost, WorkerSpec, make_specs, portable_error
from reshard.comm.launchers.raywatch import children_of, start_time, watch_ray
from reshard.core.errors import ExecutionError, ReshardBaseError

if TYPE_CHECKING:
    from reshard.comm.calls import WorkerCall
    from reshard.core.cluster import Cluster

_CLOSE_WAIT = 10.0  # seconds close() waits for killed actors of this machine to exit
_CLOSE_ASK = 3.0  # of which seconds ray.kill gets before close() kills them itself


# ----- rendezvous --------------------------------------------------------------------
@ray.remote(num_cpus=0)
class _KeyValueActor:
    """Async key/value table; ``get`` waits for the key."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.events: dict[str, asyncio.Event] = {}

    def _event(self, key: str) -> asyncio.Event:
        ev = self.events.get(key)
        if ev is None:
            ev = self.events[key] = asyncio.Event()
        return ev

    async def set(self, key: str, value: bytes) -> None:
        self.data[key] = value
        self._event(key).set()

    async def get(self, key: str, timeout: float) -> bytes | None:
        try:
            await asyncio.wait_for(self._event(key).wait(), timeout)
        except TimeoutError:
            return None
        return self.data[key]


@dataclass(frozen=True)
class RayRendezvous:
    """Rendezvous through a :class:`_KeyValueActor` (picklable; it is its own client)."""

    actor: Any

    def connect(self, timeout: float = 60.0) -> RayRendezvous:
        """This object (calls go through the actor handle)."""
        return self

    def set(self, key: str, value: bytes) -> None:
        """Publish ``value`` under ``key``."""
        ray.get(self.actor.set.remote(key, bytes(value)), timeout=60.0)

    def get(self, key: str, timeout: float) -> bytes:
        """Wait up to ``timeout`` seconds for ``key``."""
        try:
            value = ray.get(self.actor.get.remote(key, timeout), timeout=timeout + 30.0)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as e:
            raise ExecutionError(f"rendezvous actor unreachable: {e}") from e
        if value is None:
            raise ExecutionError(
                f"rendezvous key {key!r} was not published within {timeout:g}s (the worker "
                f"that should publish it is dead or stuck)")
        return value

    def close(self) -> None:
        """Nothing to release."""


# ----- the worker actor --------------------------------------------------------------
class _DeviceActor:
    """One device's worker inside a Ray actor."""

    def __init__(self, spec: WorkerSpec) -> None:
        os.environ.update(spec.env)  # before the backend imports torch / cupy
        self.spec = spec
        self.host: WorkerHost | None = None

    def start(self) -> dict[str, Any]:
        """Join the backend's world; returns facts about this worker."""
        spec = self.spec
        if BackendKind.parse(spec.backend).advertises and "advertise" not in spec.options:
            spec = dataclasses.replace(spec, options={
                **spec.options, "advertise": ray.util.get_node_ip_address()})
        try:
            self.host = WorkerHost(spec)
        except BaseException as e:  # noqa: BLE001 - re-raised portable
            raise portable_error(e, spec.device) from None
        return {**self.host.info(), "node": ray.get_runtime_context().get_node_id(),
                "machine": machine_id()}

    def call(self, call: WorkerCall) -> Any:
        """Run a driver's call (:mod:`reshard.comm.calls`) on this device's worker."""
        if self.host is None:
            raise ExecutionError(f"device {self.spec.device}: worker not started")
        try:
            return self.host.call(call)
        except BaseException as e:  # noqa: BLE001 - re-raised portable
            raise portable_error(e, self.spec.device) from None

    def stop(self) -> None:
        """Release the backend."""
        if self.host is not None:
            self.host.close()
            self.host = None


_RemoteDeviceActor = ray.remote(_DeviceActor)


def _unwrap(exc: BaseException, device: int) -> BaseException:
    """The original error of a Ray task failure, or one naming the dead actor."""
    if isinstance(exc, ray.exceptions.RayActorError):
        return ExecutionError(f"device {device}: worker actor died ({_first_line(exc)})")
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            return cause
    if isinstance(exc, ReshardBaseError):
        return exc
    return ExecutionError(f"device {device}: {type(exc).__name__}: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _pid_exists(pid: int) -> bool:
    """True while process ``pid`` runs: a zombie (an actor whose raylet died and whose
    new parent has not reaped it yet) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def machine_id() -> str:
    """This kernel boot and pid namespace: processes with equal values see each other's
    pids (``""`` where /proc does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def _node_order(node: dict[str, Any]) -> tuple[int, int, str, str]:
    """Sort key of a Ray node: its IP address numerically (then as text), then its id."""
    addr = str(node.get("NodeManagerAddress", ""))
    try:
        return (0, int(ipaddress.ip_address(addr)), "", node["NodeID"])
    except ValueError:
        return (1, 0, addr, node["NodeID"])


def _node_plan(cluster: Cluster | None, devices: Sequence[int],
               gpus: bool = False) -> dict[int, str | None]:
    """Ray node id per device (None: let Ray choose); with ``gpus``, only nodes that
    have GPUs host devices."""
    host_of = {d: cluster.host_of(d) if cluster is not None else 0 for d in devices}
    hosts = list(dict.fromkeys(host_of.values()))  # in first-use order
    nodes = sorted((n for n in ray.nodes() if n.get("Alive") and (
        not gpus or n.get("Resources", {}).get("GPU", 0) >= 1)), key=_node_order)
    if len(hosts) < 2 or len(nodes) < 2:
        return {d: None for d in devices}
    node_of_host = {h: nodes[i % len(nodes)]["NodeID"] for i, h in enumerate(hosts)}
    return {d: node_of_host[host_of[d]] for d in devices}


_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"
_TOKEN_ADVICE = "Token authentication is enabled for this Ray cluster"


class _DropTokenAdvice(logging.Filter):
    """Drops Ray's notice that an embedded cluster turned token authentication on,
    whose advice (``RAY_AUTH_MODE=disabled`` to opt out) contradicts reshard's docs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_TOKEN_ADVICE)


@contextmanager
def _token_advice_explained() -> Iterator[None]:
    """Start an embedded Ray without Ray's opt-out advice; say once, at INFO on the
    ``reshard`` logger, what it is and that it stays on (docs/ray-cluster.md)."""
    drop = _DropTokenAdvice()
    source = logging.getLogger(_TOKEN_LOGGER)
    source.addFilter(drop)
    try:
        yield
    finally:
        source.removeFilter(drop)
    logging.getLogger("reshard").info(
        "the embedded Ray runs with token authentication (Ray's default for a local "
        "cluster); keep it on: docs/ray-cluster.md")


class RayGroup:
    """Workers as Ray actors, one per device.

    Args:
        backend: ``gloo`` or ``nccl``.
        devices: devices to start workers for.
        cluster: maps devices to hosts (placement, per-host GPU indices).
        timeout: seconds any blocking operation may wait; start-up may take this plus
            a minute.
        address: Ray address to join; None for an embedded local Ray.
        env: extra environment variables for the workers (``{device}``, ``{rank}``,
            ``{host}`` in values are replaced per worker).
    """

    def __init__(self, backend: BackendKind, devices: Sequence[int], cluster: Cluster | None,
                 timeout: float, address: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.backend = BackendKind.parse(backend)
        self.timeout = float(timeout)
        self._closed = False
        self._dead: dict[int, str] = {}
        self.actors: dict[int, Any] = {}
        self.info: dict[int, dict[str, Any]] = {}
        self._born: dict[int, int | None] = {}  # local actor pid -> its start time
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:  # an embedded local Ray: it must go with this driver, even killed
                before = children_of(os.getpid())
                with _token_advice_explained():
                    ray.init(include_dashboard=False, log_to_driver=False)
                watch_ray(os.getpid(), children_of(os.getpid()) - before)
        self._node = ray.get_runtime_context().get_node_id()
        self._machine = machine_id()
        self._kv = _KeyValueActor.options(  # type: ignore[attr-defined]
            num_cpus=0, max_concurrency=1000,
            scheduling_strategy=NodeAffinitySchedulingStrategy(self._node, soft=True),
        ).remote()
        self._atexit = close_at_exit(self)
        try:
            self._start(make_specs(self.backend.value, devices, cluster, self.timeout,
                                   RayRendezvous(self._kv), env),
                        _node_plan(cluster, sorted(devices), gpus=self._wants_gpus(env)))
        except BaseException:
            self.close()
            raise

    def _wants_gpus(self, env: dict[str, str] | None) -> bool:
        """True if every actor asks Ray for a GPU (nccl, unless ``env`` pins them)."""
        return self.backend is BackendKind.NCCL and "CUDA_VISIBLE_DEVICES" not in (env or {})

    def _start(self, specs: list[WorkerSpec], nodes: dict[int, str | None]) -> None:
        for spec in specs:
            opts: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0, "max_concurrency": 1}
            if self._wants_gpus(dict(spec.env)):
                opts["num_gpus"] = 1
            node = nodes.get(spec.device)
            if node is not None:
                opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
            self.actors[spec.device] = _RemoteDeviceActor.options(**opts).remote(spec)
        refs = {d: a.start.remote() for d, a in self.actors.items()}
        deadline = time.monotonic() + self.timeout + 60.0
        pending = dict(refs)
        problems: list[str] = []
        while pending and not problems:
            ready, _ = ray.wait(list(pending.values()), num_returns=1,
                                timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            for r in ready:
                d = next(k for k, v in pending.items() if v == r)
                del pending[d]
                try:
                    self.info[d] = ray.get(r)
                    if self._machine and self.info[d].get("machine") == self._machine:
                        self._born[self.info[d]["pid"]] = start_time(self.info[d]["pid"])
                except Exception as e:  # noqa: BLE001 - collected and reported
                    problems.append(str(_unwrap(e, d)))
            if pending and time.monotonic() > deadline:
                problems.append(f"device(s) {sorted(pending)} did not start within "
                                f"{self.timeout + 60:g}s")
        if problems:
            raise ExecutionError(
                f"starting {len(specs)} {self.backend.value} Ray actors failed: "
                + "; ".join(problems))

    @property
    def devices(self) -> tuple[int, ...]:
        """Devices with a worker."""
        return tuple(sorted(self.actors))

    @property
    def pids(self) -> dict[int, int]:
        """Process id of every device's actor."""
        return {d: i["pid"] for d, i in self.info.items()}

    def submit(self, device: int, call: WorkerCall) -> Future:
        """Run ``call`` on ``device``'s actor."""
        out: Future = Future()
        actor = self.actors.get(device)
        if actor is None or self._closed:
            out.set_exception(ExecutionError(
                f"device {device} has no worker" if actor is None
                else "the worker group is closed"))
            return out
        if device in self._dead:
            out.set_exception(ExecutionError(f"device {device}: {self._dead[device]}"))
            return out
        inner = actor.call.remote(call).future()

        def done(f: Future) -> None:
            exc = f.exception()
            if exc is None:
                out.set_result(f.result())
                return
            if isinstance(exc, ray.exceptions.RayActorError) and not self._closed:
                self._dead.setdefault(device, f"worker actor died ({_first_line(exc)})")
            out.set_exception(_unwrap(exc, device))

        inner.add_done_callback(done)
        return out

    def ensure(self, devices: Iterable[int]) -> None:
        """Raise naming the devices that have no worker (workers start with the group)."""
        require_workers(devices, self.devices)

    def _local_pids(self) -> list[int]:
        """Pids of the actors on this machine (pid namespace), which it can watch."""
        return [i["pid"] for i in self.info.values()
                if self._machine and i.get("machine") == self._machine]

    def dead(self) -> dict[int, str]:
        """Actors known dead: a call failed with ``RayActorError``, or the process of an
        actor on this machine is gone."""
        if self._closed:
            return {}
        out = dict(self._dead)
        for d, info in self.info.items():
            if d in out or not self._machine or info.get("machine") != self._machine:
                continue
            if not _pid_exists(info["pid"]):
                out[d] = f"worker actor process {info['pid']} is gone"
        return out

    def abort(self) -> None:
        """Same as :meth:`close` (actors are killed, not asked)."""
        self.close()

    def close(self, grace: float | None = None) -> None:
        """Kill every actor (idempotent; ``grace``: ignored, actors are killed at
        once)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        if not ray.is_initialized():
            return
        for actor in [*self.actors.values(), self._kv]:
            with contextlib.suppress(Exception):  # best effort: already gone
                ray.kill(actor, no_restart=True)
        # ray.kill is asynchronous, and it cannot reach an actor whose raylet died (such
        # an actor notices by itself, seconds later, or much later on a loaded machine):
        # wait for the actors of this machine to exit, then SIGKILL what is left (each
        # only while its start time is the one recorded at start: never a reused pid).
        local = self._local_pids()
        born = {p: self._born.get(p) for p in local}
        t0 = time.monotonic()
        while local and time.monotonic() < t0 + _CLOSE_WAIT:
            local = [p for p in local if _pid_exists(p)]
            if local and time.monotonic() > t0 + _CLOSE_ASK:
                for p in local:
                    if born[p] is not None and start_time(p) == born[p]:
                        with contextlib.suppress(OSError):
                            os.kill(p, signal.SIGKILL)
                born = dict.fromkeys(born)  # killed once: only waited for now
            if local:
                time.sleep(0.05)


__all__ = ["RayGroup", "RayRendezvous"]

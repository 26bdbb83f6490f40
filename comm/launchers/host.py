"""What runs inside every worker process (process and Ray launchers alike).

A :class:`WorkerHost` builds the backend rank for its device from a
:class:`WorkerSpec`, wraps it in a :class:`~reshard.comm.worker.DeviceWorker`, and
runs the driver's typed calls (:mod:`reshard.comm.calls`; plans arrive as the
programs the driver cut from a plan it verified).

Nothing here imports torch or cupy at module level: the launcher applies the
worker's environment first (``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``,
``NCCL_HOSTID`` ...), then the backend imports them.
"""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reshard.comm.backend import builtin_backends
from reshard.comm.bootstrap.link_key import LinkKey
from reshard.core.errors import ExecutionError, ReshardBaseError, ReshardError

if TYPE_CHECKING:
    from reshard.comm.calls import WorkerCall
    from reshard.core.cluster import Cluster

# Environment every worker gets unless the caller's ``env`` says otherwise: many
# workers share few cores, and their copies are memory-bound.
DEFAULT_ENV: Mapping[str, str] = {"OMP_NUM_THREADS": "1"}

@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs to start its backend rank.

    Attributes:
        backend: the backend name (a ``BackendKind`` value).
        device: the global device id served.
        world: every device of the runtime, sorted; the rank is the index in it.
        timeout: seconds any blocking operation may wait.
        rendezvous: an address with ``connect()`` (see :mod:`reshard.comm.bootstrap.rendezvous`).
        host: the cluster host of the device.
        local_index: the device's position among the world's devices on its host.
        env: environment variables to set before the backend is imported.
        options: backend keyword options (``advertise`` for gloo, ``gpu`` for nccl).
    """

    backend: str
    device: int
    world: tuple[int, ...]
    timeout: float
    rendezvous: Any
    host: int = 0
    local_index: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        """Index of the device in :attr:`world`."""
        return self.world.index(self.device)


def worker_env(env: Mapping[str, str] | None, device: int, rank: int, host: int) -> dict[str, str]:
    """The variables to set in a worker: :data:`DEFAULT_ENV`, then ``env``.

    In values, ``{device}``, ``{rank}`` and ``{host}`` are replaced by the worker's
    global device id, rank and cluster host, so one mapping can give every worker its
    own value (e.g. ``{"NCCL_HOSTID": "rank{device}"}`` when ranks share a GPU).
    """
    out = dict(DEFAULT_ENV)
    for k, v in (env or {}).items():
        out[str(k)] = (str(v).replace("{device}", str(device)).replace("{rank}", str(rank))
                       .replace("{host}", str(host)))
    return out


def make_specs(backend: str, devices: Sequence[int], cluster: Cluster | None, timeout: float,
               rendezvous: Any, env: Mapping[str, str] | None,
               options: Mapping[str, Any] | None = None) -> list[WorkerSpec]:
    """One :class:`WorkerSpec` per device (world = the sorted devices). A run of a
    backend the registry marks :attr:`~reshard.comm.backend.BackendEntry.keyed` (``tcp``,
    ``nixl``) gets one fresh :class:`~reshard.comm.bootstrap.link_key.LinkKey` in every spec's
    options (unless ``options`` has one): its connections authenticate with it, and it
    travels only with the specs, never through the rendezvous."""
    world = tuple(sorted(int(d) for d in devices))
    if len(set(world)) != len(world):
        raise ReshardError(f"devices {list(devices)} contain duplicates")
    options = dict(options or {})
    registry = builtin_backends()
    if backend in registry and registry.entry(backend).keyed and "link_key" not in options:
        options["link_key"] = LinkKey.new()
    specs = []
    seen_on_host: dict[int, int] = {}
    for rank, d in enumerate(world):
        host = cluster.host_of(d) if cluster is not None else 0
        local = seen_on_host.get(host, 0)
        seen_on_host[host] = local + 1
        specs.append(WorkerSpec(backend, d, world, float(timeout), rendezvous, host, local,
                                worker_env(env, d, rank, host), dict(options)))
    return specs


def describe_exit(code: int | None) -> str:
    """``exitcode`` of a process in words."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def portable_error(exc: BaseException, device: int) -> BaseException:
    """``exc`` if it survives pickling into a process without torch/cupy state,
    else an :class:`ExecutionError` carrying its text."""
    if isinstance(exc, ReshardBaseError):
        try:
            pickle.loads(pickle.dumps(exc))
            return exc
        except Exception:  # noqa: BLE001, S110 - unpicklable: sent as text below
            pass
    return ExecutionError(f"device {device}: {type(exc).__name__}: {exc}")


class WorkerHost:
    """One device's backend rank and worker, running the driver's calls.

    Constructing it joins the backend's world: every worker of the runtime must
    construct its host at about the same time.

    Args:
        spec: what to start.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        from reshard.comm.backend import backend_class
        from reshard.comm.launchers.scheduling import apply, for_backend
        from reshard.comm.worker import DeviceWorker

        self.spec = spec
        cls = backend_class(spec.backend)
        # Before the backend starts its threads (they inherit the policy).
        self.scheduling = apply(for_backend(spec.backend, os.environ))
        self.rendezvous = spec.rendezvous.connect(spec.timeout)
        self.backend = cls(spec.device, spec.world, self.rendezvous, spec.timeout,
                           host=spec.host, local_index=spec.local_index, **spec.options)
        self.worker = DeviceWorker(spec.device, self.backend)

    def info(self) -> dict[str, Any]:
        """Facts the driver records about this worker: its device, process id and
        scheduling policy (:mod:`reshard.comm.launchers.scheduling`)."""
        return {"device": self.spec.device, "pid": os.getpid(), "scheduling": self.scheduling}

    def call(self, call: WorkerCall) -> Any:
        """Run a driver's call (:mod:`reshard.comm.calls`) on this device's worker."""
        self.backend.activate()
        return self.worker.run(call)

    def close(self) -> None:
        """Release the backend (its channels first) and the rendezvous connection."""
        try:
            for channel in self.worker.channels.values():
                channel.close()
            self.backend.close()
        finally:
            self.rendezvous.close()


__all__ = ["DEFAULT_ENV", "WorkerHost", "WorkerSpec", "describe_exit",
           "make_specs", "portable_error", "worker_env"]

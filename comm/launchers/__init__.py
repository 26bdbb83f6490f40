"""Launchers: how the workers of a runtime are started."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reshard.comm.backend import BackendKind
from reshard.comm.launchers.base import LauncherKind, WorkerGroup
from reshard.core.cluster import Cluster
from reshard.core.errors import MissingDependencyError, OptionError


def start_group(backend: BackendKind, launcher: LauncherKind, devices: Sequence[int],
                cluster: Cluster | None, timeout: float, address: str | None = None,
                env: dict[str, str] | None = None, netns: Any = None) -> WorkerGroup:
    """Start one worker per device with the given backend and launcher (``netns``: see
    :class:`~reshard.comm.launchers.process.ProcessGroup`; process launcher only)."""
    if netns is not None and launcher is not LauncherKind.PROCESS:
        raise OptionError(
            f"netns=... runs workers inside network namespaces, which only the process "
            f"launcher does; got launcher={launcher.value!r}: use launcher='process', or "
            f"run a RayCluster on the testbed and pass launcher='ray', address=rc.address")
    if launcher is LauncherKind.THREAD:
        if backend is not BackendKind.LOCAL:
            raise OptionError(
                f"the thread launcher runs only the local backend, not {backend.value!r}; "
                f"use launcher='process' or 'ray'")
        from reshard.comm.launchers.thread import ThreadGroup

        return ThreadGroup(devices, timeout)
    if backend is BackendKind.LOCAL:
        raise OptionError(
            "the local backend runs in the driver process (launcher='thread'); for real "
            "worker processes use backend='gloo' (CPU) or 'nccl' (GPU)")
    if launcher is LauncherKind.PROCESS:
        from reshard.comm.launchers.process import ProcessGroup

        return ProcessGroup(backend, devices, cluster, timeout, env=env, netns=netns)
    try:
        from reshard.comm.launchers.ray import RayGroup
    except ModuleNotFoundError as e:
        if e.name != "ray":
            raise
        raise MissingDependencyError(
            "launcher='ray' needs Ray, which is not installed: pip install 'reshard[ray]' "
            "(or use launcher='process' on one machine)") from None
    return RayGroup(backend, devices, cluster, timeout, address=address, env=env)


__all__ = ["LauncherKind", "WorkerGroup", "start_group"]

"""What a launcher provides: a group of workers, one per device, each running the
driver's typed calls (:mod:`reshard.comm.calls`)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Protocol

from reshard.comm.calls import WorkerCall
from reshard.core.choice import parse_choice
from reshard.core.errors import ReshardError


class LauncherKind(enum.Enum):
    """How worker processes are started."""

    THREAD = "thread"  # every device a thread of the driver (local backend only)
    PROCESS = "process"  # plain local processes (also the netns testbed, GPU image)
    RAY = "ray"  # one Ray actor per device

    @classmethod
    def parse(cls, value: str | LauncherKind) -> LauncherKind:
        """Accept a LauncherKind or its name; raise listing the valid names."""
        return parse_choice(cls, value, "launcher")

class WorkerGroup(Protocol):
    """Workers (each a :class:`reshard.comm.worker.DeviceWorker`) for a set of devices.

    Calls to one device run one at a time in submission order; calls to different
    devices run concurrently. A worker that dies fails its pending futures with
    :class:`reshard.ExecutionError` naming the device.
    """

    @property
    def devices(self) -> tuple[int, ...]:
        """The devices that have a worker."""

    @property
    def pids(self) -> dict[int, int]:
        """The process id each device's worker runs in (where known)."""

    def submit(self, device: int, call: WorkerCall) -> Future:
        """Run ``call`` (:mod:`reshard.comm.calls`) on ``device``'s worker."""

    def ensure(self, devices: Iterable[int]) -> None:
        """Make sure every device has a worker: start missing ones where the launcher
        can (threads), else raise :class:`reshard.ReshardError` naming them."""

    def dead(self) -> dict[int, str]:
        """Devices whose worker is gone, with a reason."""

    def close(self, grace: float | None = None) -> None:
        """Stop every worker and release every resource (idempotent); ``grace``: the
        most seconds workers get to exit on their own before they are killed (None:
        the launcher's own; launchers whose workers are threads ignore it)."""

    def abort(self) -> None:
        """Like :meth:`close`, but without waiting for workers to finish what they are
        doing (after a failure their state is unknown)."""


def require_workers(devices: Iterable[int], have: Iterable[int]) -> None:
    """Raise naming the devices of ``devices`` that have no worker (of ``have``)."""
    missing = sorted(set(devices) - set(have))
    if missing:
        raise ReshardError(
            f"device(s) {missing} have no worker; the runtime was started for "
            f"{sorted(have)} (its cluster): use layouts on those devices or a larger cluster")

"""Thread launcher: every device a thread of the driver, ranks of the local backend."""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from reshard.comm.backends.local import LocalBackend, LocalFabric
from reshard.comm.worker import DeviceWorker

if TYPE_CHECKING:
    from reshard.comm.calls import WorkerCall


class ThreadGroup:
    """Workers as threads sharing one :class:`LocalFabric`.

    Devices can be added at any time (:meth:`ensure`), so a local runtime needs no
    cluster up front.
    """

    def __init__(self, devices: Iterable[int] = (), timeout: float = 60.0) -> None:
        self.fabric = LocalFabric(timeout)
        self.workers: dict[int, DeviceWorker] = {}
        self.pools: dict[int, ThreadPoolExecutor] = {}
        self.ensure(devices)

    @property
    def devices(self) -> tuple[int, ...]:
        """Devices with a worker."""
        return tuple(sorted(self.workers))

    @property
    def pids(self) -> dict[int, int]:
        """Process id of every device's worker (threads: the driver's own)."""
        return dict.fromkeys(self.workers, os.getpid())

    def ensure(self, devices: Iterable[int]) -> None:
        """Start workers for devices that have none."""
        for d in devices:
            if d not in self.workers:
                self.workers[d] = DeviceWorker(d, LocalBackend(d, self.fabric))
                self.pools[d] = ThreadPoolExecutor(1, thread_name_prefix=f"reshard-dev{d}")

    def submit(self, device: int, call: WorkerCall) -> Future:
        """Run ``call`` on the device's worker thread."""
        self.ensure((device,))
        return self.pools[device].submit(self.workers[device].run, call)

    def dead(self) -> dict[int, str]:
        """Threads do not die on their own."""
        return {}

    def abort(self) -> None:
        """Same as :meth:`close` (blocked receivers are woken)."""
        self.close()

    def close(self, grace: float | None = None) -> None:
        """Wake blocked receivers and stop the threads (``grace``: ignored; threads
        cannot be killed)."""
        self.fabric.closed.set()
        for pool in self.pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        self.pools.clear()
        self.workers.clear()

"""A key/value store the host already has, as the rendezvous reshard's backends bootstrap
through.

The ``gloo`` and ``nccl`` backends exchange a few bytes before they can talk (the gloo
store's address, NCCL unique ids) through a rendezvous client: ``set(key, value)``,
``get(key, timeout) -> bytes``, ``close()`` (:class:`reshard.comm.bootstrap.rendezvous.RendezvousClient`).
A Runtime hosts its own; an embedding process hands over the store it has: a torch
``Store`` (``TCPStore``, ``FileStore``, ``PrefixStore``, the one behind its process
group) through :class:`StoreRendezvous`, or any object with that interface (a wrapper
over Ray's KV, an MPI broadcast).
"""

from __future__ import annotations

import datetime
from typing import Any

from reshard.core.errors import ExecutionError


class StoreRendezvous:
    """A torch ``Store`` as a rendezvous client.

    Args:
        store: the store (every rank of the backend's world uses the same one).
        prefix: a key prefix, so several worlds can share one store.
    """

    def __init__(self, store: Any, prefix: str = "reshard/") -> None:
        self.store = store
        self.prefix = prefix

    def set(self, key: str, value: bytes) -> None:
        """Publish ``value`` under ``key``."""
        self.store.set(self.prefix + key, value)

    def get(self, key: str, timeout: float) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` seconds for it to be set.

        Raises:
            ExecutionError: not set within ``timeout`` (a peer dead or not started).
        """
        full = self.prefix + key
        try:
            self.store.wait([full], datetime.timedelta(seconds=timeout))
            return bytes(self.store.get(full))
        except RuntimeError as e:  # torch's store timeout / connection errors
            raise ExecutionError(
                f"rendezvous key {full!r} not set within {timeout:g}s in the host's store "
                f"(a peer dead or not started): {' '.join(str(e).split())[:200]}") from e

    def close(self) -> None:
        """Nothing to release: the store belongs to the host."""


__all__ = ["StoreRendezvous"]

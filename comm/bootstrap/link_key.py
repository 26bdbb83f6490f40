"""A run's link key: the secret its data-plane connections authenticate with.

reshard's launchers make one per run (:func:`reshard.comm.launchers.host.make_specs`)
and hand it to each worker with its spec, down the pipe that starts it (or through
Ray's object store): it is never published in the rendezvous, so a process that reads
(or writes) the rendezvous cannot introduce itself as a worker. The ``tcp`` backend
introduces its connections with it (:mod:`reshard.comm.backends.tcp_intro`), the
``nixl`` backend signs its agents' metadata and its notifications with it
(:mod:`reshard.comm.backends.nixl_agent`). Its repr hides it.

What it does not stop: a process of the same user that reads another's memory (ptrace,
``/proc/<pid>/mem``, the pipes of a worker) holds the key like any worker.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from dataclasses import dataclass, field

from reshard.core.errors import ExecutionError


@dataclass(frozen=True)
class LinkKey:
    """A run's key (module docstring)."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.secret, bytes) or len(self.secret) < 16:
            raise ExecutionError(
                f"a link key must be at least 16 random bytes, got "
                f"{type(self.secret).__name__} of length {len(self.secret or b'')}; make "
                f"one with LinkKey.new()")

    @classmethod
    def new(cls) -> LinkKey:
        """A fresh random key (32 bytes)."""
        return cls(secrets.token_bytes(32))

    @classmethod
    def of(cls, key: LinkKey | bytes | None) -> LinkKey | None:
        """``key`` as a LinkKey (bytes wrapped; None stays None)."""
        return cls(key) if isinstance(key, bytes) else key


def mac(secret: bytes, what: bytes, devices: tuple[int, ...], data: bytes) -> bytes:
    """HMAC-SHA256 under ``secret`` of a purpose (``what``), the devices involved (in
    a fixed order) and ``data``."""
    return hmac.new(secret, what + struct.pack(f"<{len(devices)}q", *devices) + data,
                    hashlib.sha256).digest()


__all__ = ["LinkKey", "mac"]

"""How a ``tcp`` connection introduces itself: the wire format, the keys, and the
connector's side (the listener's is :mod:`reshard.comm.backends.tcp_hub`).

Three messages, each authenticated by HMAC-SHA256 under one secret, which never crosses
the wire:

1. the listener's *challenge*: magic and a fresh 16-byte nonce;
2. the connector's *hello*: magic, ``HMAC(secret, "hello" | nonce | connector | listener
   | channel)``, the connecting device and the channel's name;
3. the listener's *verdict*: ``Y`` and ``HMAC(secret, "taken" | nonce | connector |
   listener | channel)`` once it keeps the connection for that (channel, device), or
   ``N`` and the reason in words (a second claim of the same (channel, device), a
   channel this rank does not have).

The connector uses the connection only after a ``Y`` whose proof checks: a listener
that does not hold the secret (an address rewritten in the rendezvous) cannot make one,
and a connection the listener did not keep (a second claim, an impostor's first) fails
before an operation on it can succeed.

The secret is the run's :class:`~reshard.comm.bootstrap.link_key.LinkKey` where the launcher
handed one to every worker (with its spec: the rendezvous never holds it), else the
listener's own random secret, published with its address (embedded ranks that did not
get a key: anyone who can read the rendezvous can then introduce themselves).
"""

from __future__ import annotations

import hmac
import socket
import struct

from reshard.comm.bootstrap.link_key import LinkKey, mac
from reshard.comm.bootstrap.sockets import recv_exact
from reshard.core.errors import ExecutionError

MAGIC = b"RSH3"
CHALLENGE = struct.Struct("<4s16s")
"""A listener's first bytes on a new connection: magic, a fresh nonce."""
HELLO = struct.Struct("<4s32sqH")
"""A connector's answer: magic, its MAC (:func:`hello_mac`), the connecting device, the
length of the channel's name (which follows, UTF-8)."""
VERDICT = struct.Struct("<c32sH")
"""The listener's answer: ``Y`` and its proof (:func:`taken_mac`), or ``N``, 32 zero
bytes and the length of the reason (which follows, UTF-8)."""
HELLO_WAIT = 2.0
"""Seconds a new connection has, in all, to introduce itself (not per byte)."""
MAX_NAME = 4096
"""The longest channel name a hello may carry."""


def hello_mac(secret: bytes, nonce: bytes, connector: int, listener: int, name: bytes) -> bytes:
    """The connector's answer to a challenge."""
    return mac(secret, b"hello" + nonce, (connector, listener), name)


def taken_mac(secret: bytes, nonce: bytes, connector: int, listener: int, name: bytes) -> bytes:
    """The listener's proof that it kept the connection."""
    return mac(secret, b"taken" + nonce, (connector, listener), name)


def refusal(reason: str) -> bytes:
    """A verdict of ``N`` with ``reason``."""
    text = reason.encode()[:MAX_NAME]
    return VERDICT.pack(b"N", bytes(32), len(text)) + text


def introduce(sock: socket.socket, secret: bytes, me: int, peer: int, channel: str,
              deadline: float) -> bool:
    """The connector's side on a new connection ``sock`` to ``peer``'s listener: answer
    its challenge, then wait for its verdict (all by ``deadline``, ``time.monotonic()``).

    Returns:
        True once kept (a ``Y`` whose proof checks); False when the listener closed the
        connection first (dropped unanswered: past its deadline, or pushed out by a
        flood of connections; the caller tries again).

    Raises:
        ExecutionError: refused (``N``, with the listener's reason), a proof that does
            not check, or no challenge / verdict by the deadline.
    """
    name = channel.encode()
    where = f"device {me}: device {peer}'s listener"
    try:
        magic, nonce = CHALLENGE.unpack(recv_exact(sock, CHALLENGE.size,
                                                    "the listener's challenge", deadline))
        if magic != MAGIC:
            raise ExecutionError(f"{where} sent no reshard tcp challenge (magic {magic!r}; "
                                 f"another program on that port, or another reshard "
                                 f"version)")
        sock.sendall(HELLO.pack(MAGIC, hello_mac(secret, nonce, me, peer, name), me,
                                len(name)) + name)
        mark, proof, n = VERDICT.unpack(recv_exact(sock, VERDICT.size, "the verdict",
                                                   deadline))
        reason = recv_exact(sock, n, "the verdict", deadline) if n else b""
    except TimeoutError as e:
        raise ExecutionError(f"{where} did not answer the introduction on channel "
                             f"{channel or 'main'!r} in time (peer stuck?): {e}") from e
    except (ConnectionError, OSError):
        return False
    if mark == b"Y" and hmac.compare_digest(proof, taken_mac(secret, nonce, me, peer, name)):
        return True
    if mark == b"N":
        raise ExecutionError(f"{where} refused the connection on channel "
                             f"{channel or 'main'!r}: {reason.decode(errors='replace')}")
    raise ExecutionError(
        f"{where} answered the introduction on channel {channel or 'main'!r} without "
        f"proving it holds the run's key: not device {peer} (its address in the "
        f"rendezvous was rewritten?); refusing to use the connection")


__all__ = ["CHALLENGE", "HELLO", "HELLO_WAIT", "MAGIC", "MAX_NAME", "VERDICT", "LinkKey",
           "hello_mac", "introduce", "refusal", "taken_mac"]

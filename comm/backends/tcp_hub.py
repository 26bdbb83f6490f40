"""The ``tcp`` backend's connections: a rank's listener, the introduction of a new
connection, and the table of connections accepted for channels not yet asking.

Wire: one TCP connection per pair of devices and channel, made when a plan loads
(:meth:`TcpBackend.prepare`), else on first use (the lower device connects to the
listener the higher one published through the driver's rendezvous). Its introduction
is a challenge and a response: the listener sends a fresh nonce, the connector answers
with its device, the channel's name and an HMAC-SHA256 of them and the nonce under the
listener's secret (read from the rendezvous), so the secret never crosses the wire and
a recorded introduction cannot be replayed. The listener reads every pending
introduction at once (up to :data:`PENDING`, the oldest dropped first), each within
one overall deadline (:data:`HELLO_WAIT`): a silent or slow connection costs the real
ones nothing. A second connection that claims a (channel, device) already claimed is
refused loudly: before the channel took the first, both are closed and the channel's
accept fails naming the claim; after, the newcomer is closed and logged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

from reshard.comm.sockets import listen_on, recv_exact
from reshard.errors import ExecutionError

_log = logging.getLogger("reshard.tcp")

CHALLENGE = struct.Struct("<4s16s")
"""A listener's first bytes on a new connection: magic, a fresh nonce."""
HELLO = struct.Struct("<4s32sqH")
"""A connector's answer: magic, HMAC-SHA256(listener's secret, nonce + device + channel
name), the connecting device, the length of the channel's name (which follows, UTF-8)."""
MAGIC = b"RSH2"
HELLO_WAIT = 2.0
"""Seconds a new connection has, in all, to introduce itself (not per byte)."""
PENDING = 64
"""Introductions a listener reads at once; past it the oldest pending one is dropped."""
BACKLOG = 4096
"""Connections the listener queues before they are accepted (the first all-gather of
an SPMD world connects every lower device at once)."""

def mac(secret: bytes, nonce: bytes, device: int, name: bytes) -> bytes:
    """The response to a challenge: HMAC-SHA256 of the nonce, the device and the
    channel's name under the listener's secret."""
    return hmac.new(secret, nonce + struct.pack("<q", device) + name, hashlib.sha256).digest()


@dataclass
class _Pending:
    """A new connection whose introduction is being read: when it must be complete,
    the nonce it was sent, and the bytes so far."""

    deadline: float
    nonce: bytes
    got: bytearray


class Hub:
    """What the channels of one rank share: its listener (and its secret), the
    connections accepted for any channel until that channel asks, and the peers'
    published addresses. Channels run on threads of their own: one of them at a time
    takes the listener (``listening``) for one short round of accepting and reading
    introductions (the pending ones live only under it); the table of accepted
    connections has a lock of its own, held only to look; the rendezvous (one
    connection, not thread-safe) a third."""

    def __init__(self, advertise: str, rendezvous: Any, timeout: float) -> None:
        self.listener = listen_on(advertise, backlog=BACKLOG)
        self.listener.setblocking(False)
        self.secret = secrets.token_bytes(16)
        self.rendezvous, self.timeout = rendezvous, timeout
        self.listening = threading.Lock()  # the listener, pending
        self.lock = threading.Lock()  # accepted, taken, conflicts, closed
        self.asking = threading.Lock()  # the rendezvous, addresses
        self.accepted: dict[tuple[str, int], socket.socket] = {}
        self.taken: set[tuple[str, int]] = set()
        self.conflicts: dict[tuple[str, int], str] = {}
        self.pending: dict[socket.socket, _Pending] = {}
        self.addresses: dict[int, tuple[str, int, bytes]] = {}
        self.closed = False
        host, port = self.listener.getsockname()[:2]
        self.published = f"{host}|{port}|{self.secret.hex()}".encode()

    def address(self, peer: int) -> tuple[str, int, bytes]:
        """Where ``peer`` listens, and its secret (from the rendezvous, once)."""
        with self.asking:
            got = self.addresses.get(peer)
            if got is None:
                raw = self.rendezvous.get(f"tcp/{peer}", self.timeout).decode()
                host, port, secret = raw.split("|")
                got = self.addresses[peer] = (host, int(port), bytes.fromhex(secret))
            return got

    def connect(self, me: int, peer: int, channel: str) -> socket.socket:
        """A new connection to ``peer`` for ``channel``, introduced (its challenge
        answered)."""
        host, port, secret = self.address(peer)
        sock = None
        try:
            sock = socket.create_connection((host, port), timeout=self.timeout)
            sock.settimeout(min(self.timeout, HELLO_WAIT))
            magic, nonce = CHALLENGE.unpack(recv_exact(sock, CHALLENGE.size,
                                                        "the listener's challenge"))
            if magic != MAGIC:
                raise ConnectionError("it sent no reshard tcp challenge")
            name = channel.encode()
            sock.sendall(HELLO.pack(MAGIC, mac(secret, nonce, me, name), me, len(name))
                         + name)
        except OSError as e:
            if sock is not None:
                sock.close()
            raise ExecutionError(f"device {me}: cannot connect to device {peer} at "
                                 f"{host}:{port}: {e}") from e
        return sock

    def accept(self, me: int, peer: int, channel: str) -> socket.socket:
        """The connection ``peer`` made (or makes within the timeout) for ``channel``;
        others introduced meanwhile are kept for whoever asks for them."""
        deadline = time.monotonic() + self.timeout
        key = (channel, peer)
        while True:
            with self.lock:
                if self.closed:
                    raise ExecutionError(f"device {me}: closed while waiting for device "
                                         f"{peer} to connect")
                if key in self.conflicts:
                    raise ExecutionError(f"device {me}: {self.conflicts[key]}")
                sock = self.accepted.pop(key, None)
                if sock is not None:
                    self.taken.add(key)
                    return sock
            if self.listening.acquire(timeout=0.05):
                try:
                    self._introduce(0.05)
                finally:
                    self.listening.release()
            if time.monotonic() > deadline:
                raise ExecutionError(f"device {me}: device {peer} did not connect within "
                                     f"{self.timeout:g}s (channel {channel or 'main'!r}; "
                                     f"peer dead or stuck)")

    def _introduce(self, wait: float) -> None:
        """One round, holding ``listening``: take every connection the listener has
        (each sent its challenge), read what the pending ones sent (waiting at most
        ``wait`` for anything), claim the complete introductions, and drop the wrong
        ones and those past their deadline."""
        try:
            ready, _, _ = select.select([self.listener, *self.pending], [], [], wait)
        except (OSError, ValueError):  # closed under us
            return
        now = time.monotonic()
        if self.listener in ready:
            self._take_new(now)
        for conn in ready:
            if conn is not self.listener and conn in self.pending:
                self._read(conn)
        for conn, p in list(self.pending.items()):
            if now > p.deadline:
                self._drop(conn)

    def _take_new(self, now: float) -> None:
        """Accept what the listener queued, send each a challenge, keep it pending."""
        while True:
            try:
                conn = self.listener.accept()[0]
            except (BlockingIOError, OSError):
                return
            nonce = secrets.token_bytes(16)
            try:
                conn.setblocking(False)
                conn.send(CHALLENGE.pack(MAGIC, nonce))  # a fresh socket's buffer takes it
            except OSError:
                conn.close()
                continue
            if len(self.pending) >= PENDING:
                self._drop(min(self.pending, key=lambda c: self.pending[c].deadline))
            self.pending[conn] = _Pending(now + HELLO_WAIT, nonce, bytearray())

    def _read(self, conn: socket.socket) -> None:
        """Read what ``conn`` sent of its introduction (never past it: the frames
        after it are the channel's), and claim or drop it once complete."""
        p = self.pending[conn]
        want = HELLO.size - len(p.got)
        if want <= 0:
            want = HELLO.size + HELLO.unpack(bytes(p.got[:HELLO.size]))[3] - len(p.got)
        try:
            chunk = conn.recv(want)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        p.got += chunk
        if len(p.got) < HELLO.size:
            return
        magic, answer, peer, n = HELLO.unpack(bytes(p.got[:HELLO.size]))
        if magic != MAGIC:
            self._drop(conn)
            return
        if len(p.got) < HELLO.size + n:
            return
        name = bytes(p.got[HELLO.size:])
        del self.pending[conn]
        if not hmac.compare_digest(answer, mac(self.secret, p.nonce, peer, name)):
            conn.close()
            return
        try:
            channel = name.decode()
        except UnicodeDecodeError:
            conn.close()
            return
        self._claim((channel, int(peer)), conn)

    def _claim(self, key: tuple[str, int], conn: socket.socket) -> None:
        """Keep ``conn`` for the channel that asks for ``key``, unless another already
        claimed it (refused loudly: module docstring)."""
        channel, peer = key
        what = (f"two connections claimed to be device {peer} on channel "
                f"{channel or 'main'!r}; both refused (only a process that knows this "
                f"listener's secret can introduce itself: another process of this run is "
                f"confused, or the secret leaked)")
        with self.lock:
            if key in self.taken:
                conn.close()
                _log.error("reshard tcp: a second connection claimed to be device %d on "
                           "channel %r after the first was in use; closed it", peer,
                           channel or "main")
            elif key in self.accepted:
                conn.close()
                self.accepted.pop(key).close()
                self.conflicts[key] = what
            elif key in self.conflicts:
                conn.close()
            else:
                self.accepted[key] = conn

    def _drop(self, conn: socket.socket) -> None:
        self.pending.pop(conn, None)
        conn.close()

    def close(self) -> None:
        """Close the listener and the connections no channel took."""
        with self.lock:
            self.closed = True
            for sock in self.accepted.values():
                sock.close()
            self.accepted.clear()
        self.listener.close()
        if self.listening.acquire(timeout=1.0):  # a round in progress ends within 0.05 s
            try:
                for conn in list(self.pending):
                    self._drop(conn)
            finally:
                self.listening.release()


__all__ = ["BACKLOG", "CHALLENGE", "HELLO", "HELLO_WAIT", "MAGIC", "PENDING", "Hub", "mac"]

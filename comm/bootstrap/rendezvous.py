"""Rendezvous: a tiny key/value store through which worker processes bootstrap.

Workers need a few bytes from each other before they can talk: the gloo store's
address (published by rank 0) and, per NCCL member set, the unique id made by its
first member. The driver hosts the store; workers connect to it.

Two implementations share one client interface (``set(key, value)``,
``get(key, timeout) -> bytes``, ``close()``), reached through a picklable *address*
whose ``connect()`` returns a client:

* :class:`TcpRendezvous` (here): a socket server in a driver thread. Values are raw
  bytes (nothing is unpickled from the network) and every connection must present
  the server's random token first.
* ``RayRendezvous`` (``reshard.comm.launchers.ray``): an actor, for workers that
  cannot reach the driver's sockets (Ray client mode).
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from reshard.comm.bootstrap.sockets import is_wildcard, listen_on, recv_exact
from reshard.core.errors import ExecutionError

_HEAD = struct.Struct("!cII")  # op, key length, value length
_REPLY = struct.Struct("!cI")  # status, payload length
_MAX_KEY = 1 << 12
_MAX_VALUE = 1 << 20


class RendezvousClient(Protocol):
    """What workers use: publish and wait for small byte strings."""

    def set(self, key: str, value: bytes) -> None:
        """Publish ``value`` under ``key`` (last write wins)."""

    def get(self, key: str, timeout: float) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` seconds for it to be set."""

    def close(self) -> None:
        """Drop the connection."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    return recv_exact(sock, n, "rendezvous connection")



class TcpRendezvousServer:
    """The driver side: serves one key/value table to any number of workers.

    Every connection must present the token within ``auth_timeout`` seconds in all (not
    per byte: one byte every few seconds does not keep it) or is closed; at most
    ``max_pending`` connections may be waiting to authenticate (a new one closes the
    oldest waiting: a worker sends its token at once, so strangers that hold every slot
    cannot keep it out) and at most ``max_clients`` may be authenticated at once (more
    are closed at once), and a connection's thread ends with it, so idle or hostile
    connections cannot pile up threads or memory.

    Args:
        host: interface to listen on (``127.0.0.1`` for local workers); never the
            wildcard.
        port: port to listen on; 0 picks a free one.
        max_clients: authenticated connections at once (a runtime's workers use one
            each).
        max_pending: connections at once that have not authenticated yet.
        auth_timeout: seconds a new connection has, in all, to present the token.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, max_clients: int = 1024,
                 max_pending: int = 64, auth_timeout: float = 2.0) -> None:
        if is_wildcard(host):
            raise ExecutionError(
                f"the rendezvous must listen on one interface's address, not {host!r}; "
                f"use 127.0.0.1 on one machine or the cluster interface's address")
        self.token = secrets.token_bytes(16)
        self.max_clients, self.max_pending = max_clients, max_pending
        self.auth_timeout = auth_timeout
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._sock = listen_on(host, port)
        self._conns: set[socket.socket] = set()
        self._waiting: dict[socket.socket, None] = {}  # not authenticated yet, oldest first
        self._clients = 0  # authenticated connections
        self.refused = 0  # connections closed for a full table (for tests and logs)
        self.host, self.port = host, self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="reshard-rendezvous",
                                        daemon=True)
        self._thread.start()

    @property
    def address(self) -> TcpRendezvous:
        """What workers need to connect (picklable)."""
        return TcpRendezvous(self.host, self.port, self.token)

    @property
    def connections(self) -> int:
        """Connections open now (authenticated or not)."""
        with self._cond:
            return len(self._conns)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._cond:
                if self._closed:
                    conn.close()
                    return
                if len(self._waiting) >= self.max_pending:
                    oldest = next(iter(self._waiting))
                    del self._waiting[oldest]
                    self.refused += 1
                    with contextlib.suppress(OSError):
                        oldest.shutdown(socket.SHUT_RDWR)  # its thread ends, closing it
                self._waiting[conn] = None
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name="reshard-rendezvous-conn").start()

    def _authenticate(self, conn: socket.socket) -> bool:
        """Read the token within the time limit; count the connection as a client."""
        try:
            got = recv_exact(conn, len(self.token), "rendezvous connection",
                             time.monotonic() + self.auth_timeout)
            ok = secrets.compare_digest(got, self.token)
        except (OSError, ConnectionError):
            ok = False
        with self._cond:
            kept = conn in self._waiting  # not dropped as the oldest meanwhile
            self._waiting.pop(conn, None)
            ok = ok and kept
            if ok and self._clients >= self.max_clients:
                self.refused += 1
                ok = False
            if ok:
                self._clients += 1
        if ok:
            conn.settimeout(None)
            conn.sendall(b"A")  # admitted: the client may send requests
        return ok

    def _serve(self, conn: socket.socket) -> None:
        authed = False
        try:
            authed = self._authenticate(conn)
            while authed:
                op, klen, vlen = _HEAD.unpack(_recv_exact(conn, _HEAD.size))
                if klen > _MAX_KEY or vlen > _MAX_VALUE:
                    return
                key = _recv_exact(conn, klen).decode()
                value = _recv_exact(conn, vlen)
                if op == b"S":
                    with self._cond:
                        self._data[key] = value
                        self._cond.notify_all()
                    conn.sendall(_REPLY.pack(b"O", 0))
                elif op == b"G":
                    payload = self._wait_for(key, struct.unpack("!d", value)[0])
                    if payload is None:
                        conn.sendall(_REPLY.pack(b"T", 0))
                    else:
                        conn.sendall(_REPLY.pack(b"O", len(payload)) + payload)
                else:
                    return
        except (OSError, ConnectionError, struct.error, UnicodeDecodeError):
            pass
        finally:
            with self._cond:
                self._conns.discard(conn)
                if authed:
                    self._clients -= 1
            conn.close()

    def _wait_for(self, key: str, timeout: float) -> bytes | None:
        """The value of ``key`` once set, or None after ``timeout`` or at close."""
        with self._cond:
            self._cond.wait_for(lambda: key in self._data or self._closed, timeout)
            return self._data.get(key)

    def close(self) -> None:
        """Stop serving (idempotent); waiting clients get a timeout answer."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            conns, self._conns = list(self._conns), set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (Linux)
        self._sock.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        if self._thread is not threading.current_thread():
            self._thread.join(2.0)


@dataclass(frozen=True)
class TcpRendezvous:
    """Address of a :class:`TcpRendezvousServer` (host, port, token)."""

    host: str
    port: int
    token: bytes = field(repr=False)

    def connect(self, timeout: float = 60.0) -> TcpRendezvousClient:
        """A client connected to the server."""
        return TcpRendezvousClient(self, timeout)


class TcpRendezvousClient:
    """One worker's connection to a :class:`TcpRendezvousServer`.

    Args:
        address: the server's address.
        timeout: seconds to keep trying to connect.
    """

    def __init__(self, address: TcpRendezvous, timeout: float = 60.0) -> None:
        self.address = address
        self._lock = threading.Lock()
        deadline = time.monotonic() + timeout
        while True:  # retry while the server is unreachable or full
            try:
                self._sock = socket.create_connection((address.host, address.port),
                                                      timeout=max(1.0, timeout))
                self._sock.sendall(address.token)
                if _recv_exact(self._sock, 1) == b"A":
                    break
                raise ConnectionError("not admitted")
            except (OSError, ConnectionError) as e:
                sock = getattr(self, "_sock", None)
                if sock is not None:
                    sock.close()
                if time.monotonic() > deadline:
                    raise ExecutionError(
                        f"cannot reach the rendezvous at {address.host}:{address.port} "
                        f"within {timeout:g}s: {e}") from e
                time.sleep(0.05)

    def _request(self, op: bytes, key: str, value: bytes, timeout: float) -> tuple[bytes, bytes]:
        k = key.encode()
        with self._lock:
            try:
                self._sock.settimeout(timeout + 10.0)
                self._sock.sendall(_HEAD.pack(op, len(k), len(value)) + k + value)
                status, n = _REPLY.unpack(_recv_exact(self._sock, _REPLY.size))
                return status, _recv_exact(self._sock, n)
            except (OSError, ConnectionError) as e:
                raise ExecutionError(
                    f"rendezvous at {self.address.host}:{self.address.port} is gone "
                    f"(driver dead?): {e}") from e

    def set(self, key: str, value: bytes) -> None:
        """Publish ``value`` under ``key``."""
        self._request(b"S", key, bytes(value), 10.0)

    def get(self, key: str, timeout: float) -> bytes:
        """Wait up to ``timeout`` seconds for ``key``."""
        status, payload = self._request(b"G", key, struct.pack("!d", timeout), timeout)
        if status != b"O":
            raise ExecutionError(
                f"rendezvous key {key!r} was not published within {timeout:g}s (the worker "
                f"that should publish it is dead or stuck)")
        return payload

    def close(self) -> None:
        """Close the connection."""
        with contextlib.suppress(OSError):
            self._sock.close()


__all__ = ["RendezvousClient", "TcpRendezvous", "TcpRendezvousClient", "TcpRendezvousServer"]

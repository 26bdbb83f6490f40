"""The ``tcp`` backend's connections: a rank's listener, the introduction of a new
connection (wire format and the connector's side: :mod:`reshard.comm.backends.tcp_intro`),
and the table of connections accepted for channels not yet asking.

One TCP connection per pair of devices and channel, made when a plan loads
(:meth:`TcpBackend.prepare`), else on first use: the lower device connects to the
listener the higher one published through the rendezvous (its address only where the
launcher handed the run a :class:`~reshard.comm.bootstrap.link_key.LinkKey`).

The listener's side, under attack:

* *Slow, silent and many connections*: every pending introduction is read at once, each
  within one overall deadline (:data:`HELLO_WAIT`); at most :data:`PENDING` wait, and a
  new one pushes out the oldest, but only one that has had :data:`SHIELD` seconds to
  answer (a real connector answers at once): while every slot is younger, new
  connections wait in the kernel's queue. A round reads what arrived before it accepts,
  and accepts at most :data:`PENDING`, so a flood's closed connections free their slots
  and one round never accepts and pushes out thousands. A connector whose connection was
  dropped unanswered tries again until its timeout.
* *Impostors*: a wrong MAC is closed. A second valid claim of a (channel, device) is
  refused loudly: the newcomer gets ``N``; the first is failed too (closed before its
  channel took it; after, the channel's next operation raises naming the claim), so
  whichever of the two was the impostor, no operation on its link succeeds unnoticed.
* *Another channel*: a claim for a channel this rank has not opened is not answered
  until it opens; a rank waiting for that device on another channel for
  :data:`MISMATCH_WAIT` seconds refuses it and raises, naming both channels (the peer
  hears the same reason at once).
"""

from __future__ import annotations

import hmac
import logging
import secrets
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from reshard.comm.backends.tcp_intro import (
    CHALLENGE,
    HELLO,
    HELLO_WAIT,
    MAGIC,
    MAX_NAME,
    VERDICT,
    hello_mac,
    introduce,
    refusal,
    taken_mac,
)
from reshard.comm.bootstrap.link_key import LinkKey
from reshard.comm.bootstrap.sockets import listen_on
from reshard.core.errors import ExecutionError

_log = logging.getLogger("reshard.tcp")

PENDING = 64
"""Introductions a listener reads at once."""
SHIELD = 0.25
"""Seconds a pending introduction is safe from being pushed out by newer connections."""
MISMATCH_WAIT = 1.0
"""Seconds a rank waits for a device on one channel while that device's claim for a
channel this rank does not have is waiting, before it calls them mismatched."""
BACKLOG = 4096
"""Connections the listener queues before they are accepted (the first all-gather of
an SPMD world connects every lower device at once)."""


def _channel(name: str) -> str:
    return repr(name or "main")


@dataclass
class _Pending:
    """A new connection whose introduction is being read: when it came, when it must
    be complete, the nonce it was sent, and the bytes so far."""

    since: float
    deadline: float
    nonce: bytes
    got: bytearray


@dataclass
class _Claim:
    """A connection introduced as ``device`` for a channel: its nonce and channel name
    (for the proof), and whether it got its verdict yet."""

    sock: socket.socket
    device: int
    nonce: bytes
    name: bytes
    answered: bool


class Hub:
    """What the channels of one rank share: its listener (and the secret its
    introductions are checked with), the connections accepted for any channel until
    that channel asks, and the peers' published addresses. Channels run on threads of
    their own: one of them at a time takes the listener (``listening``) for one short
    round of accepting and reading introductions (the pending ones live only under it);
    the table of accepted connections has a lock of its own; the rendezvous (one
    connection, not thread-safe) a third.

    Args:
        device: this rank's device.
        advertise: the address to listen on (and publish).
        rendezvous: a rendezvous client (``get``).
        timeout: seconds to wait for a peer.
        key: the run's link key (None: a random secret of this listener's, published
            with its address).
    """

    def __init__(self, device: int, advertise: str, rendezvous: Any, timeout: float,
                 key: LinkKey | None = None) -> None:
        self.device = int(device)
        self.listener = listen_on(advertise, backlog=BACKLOG)
        self.listener.setblocking(False)
        self.keyed = key is not None
        self.secret = key.secret if key is not None else secrets.token_bytes(16)
        self.rendezvous, self.timeout = rendezvous, timeout
        self.listening = threading.Lock()  # the listener, pending
        self.lock = threading.Lock()  # accepted, taken, conflicts, channels, closed
        self.asking = threading.Lock()  # the rendezvous, addresses
        self.accepted: dict[tuple[str, int], _Claim] = {}
        self.taken: set[tuple[str, int]] = set()
        self.conflicts: dict[tuple[str, int], str] = {}
        self.channels: set[str] = {""}
        self.pending: dict[socket.socket, _Pending] = {}
        self.served = 0.0  # when a channel's wait last read introductions
        self.addresses: dict[int, tuple[str, int, bytes]] = {}
        self.closed = False
        host, port = self.listener.getsockname()[:2]
        self.published = (f"{host}|{port}" if self.keyed else
                          f"{host}|{port}|{self.secret.hex()}").encode()

    # ----- the connector's side -------------------------------------------------------
    def address(self, peer: int) -> tuple[str, int, bytes]:
        """Where ``peer`` listens, and the secret its introductions take (from the
        rendezvous, once)."""
        with self.asking:
            got = self.addresses.get(peer)
            if got is None:
                raw = self.rendezvous.get(f"tcp/{peer}", self.timeout).decode()
                parts = raw.split("|")
                if len(parts) != (2 if self.keyed else 3):
                    mine, theirs = ("has", "was not") if self.keyed else ("was not", "has")
                    raise ExecutionError(
                        f"device {self.device}: this rank {mine} given the run's tcp link "
                        f"key and device {peer} {theirs} (it published {len(parts)} "
                        f"fields): start every rank of a world alike (link_key= on all "
                        f"or none)")
                secret = self.secret if self.keyed else bytes.fromhex(parts[2])
                got = self.addresses[peer] = (parts[0], int(parts[1]), secret)
            return got

    def connect(self, me: int, peer: int, channel: str) -> socket.socket:
        """A new connection to ``peer`` for ``channel``, kept by its listener (its
        verdict's proof checked; tcp_intro's :func:`introduce`). A connection the
        listener dropped unanswered is made again until the timeout."""
        host, port, secret = self.address(peer)
        deadline = time.monotonic() + self.timeout
        tries = 0
        while True:
            tries += 1
            left = deadline - time.monotonic()
            sock = None
            try:
                if left <= 0:
                    raise TimeoutError(f"{tries - 1} connections dropped unanswered")
                sock = socket.create_connection((host, port), timeout=left)
                if introduce(sock, secret, me, peer, channel, deadline):
                    return sock
            except ExecutionError:
                if sock is not None:
                    sock.close()
                raise
            except OSError as e:
                if sock is not None:
                    sock.close()
                raise ExecutionError(f"device {me}: cannot connect to device {peer} at "
                                     f"{host}:{port} for channel {_channel(channel)} within "
                                     f"{self.timeout:g}s: {e}") from e
            sock.close()
            time.sleep(min(0.01 * tries, 0.2))  # dropped unanswered: again

    # ----- the listener's side --------------------------------------------------------
    def open_channel(self, channel: str) -> None:
        """``channel`` exists on this rank: claims for it are answered at once."""
        with self.lock:
            self.channels.add(channel)
            for (name, _), claim in self.accepted.items():
                if name == channel and not claim.answered:
                    self._answer(claim)

    def accept(self, me: int, peer: int, channel: str) -> socket.socket:
        """The connection ``peer`` made (or makes within the timeout) for ``channel``;
        others introduced meanwhile are kept for whoever asks for them."""
        start = time.monotonic()
        deadline = start + self.timeout
        key = (channel, peer)
        while True:
            with self.lock:
                if self.closed:
                    raise ExecutionError(f"device {me}: closed while waiting for device "
                                         f"{peer} to connect")
                if key in self.conflicts:
                    raise ExecutionError(f"device {me}: {self.conflicts[key]}")
                claim = self.accepted.pop(key, None)
                if claim is not None:
                    self.taken.add(key)
                    if not claim.answered and not self._answer(claim):
                        raise ExecutionError(f"device {me}: device {peer}'s connection on "
                                             f"channel {_channel(channel)} closed before "
                                             f"it was answered")
                    return claim.sock
                if time.monotonic() - start > MISMATCH_WAIT:
                    self._mismatch(peer, channel)
            if self.listening.acquire(timeout=0.05):
                try:
                    self.introduce(0.05)
                finally:
                    self.listening.release()
            if time.monotonic() > deadline:
                raise ExecutionError(f"device {me}: device {peer} did not connect within "
                                     f"{self.timeout:g}s (channel {_channel(channel)}; "
                                     f"peer dead or stuck)")

    def _mismatch(self, peer: int, channel: str) -> None:
        """Raise if ``peer`` claimed a channel this rank does not have while this rank
        waits for it on ``channel`` (holding ``lock``); the claim is refused, naming
        both."""
        for (other, dev), claim in list(self.accepted.items()):
            if dev == peer and other not in self.channels:
                why = (f"device {peer} connected on channel {_channel(other)} but device "
                       f"{self.device} has no such channel and waits for it on channel "
                       f"{_channel(channel)}: the ranks use different channel names")
                del self.accepted[(other, dev)]
                self._refuse(claim.sock, why)
                raise ExecutionError(f"device {self.device}: {why}")

    def introduce(self, wait: float) -> None:
        """One round, holding ``listening``: read what the pending connections sent
        (waiting at most ``wait`` for anything), claim the complete introductions, drop
        the wrong ones and those past their deadline, then take new connections."""
        try:
            ready, _, _ = select.select([self.listener, *self.pending], [], [], wait)
        except (OSError, ValueError):  # closed under us
            return
        for conn in ready:
            if conn is not self.listener and conn in self.pending:
                self._read(conn)
        now = time.monotonic()
        for conn, p in list(self.pending.items()):
            if now > p.deadline:
                self._drop(conn)
        if self.listener in ready:
            self._take_new(now)

    def _take_new(self, now: float) -> None:
        """Accept what the listener queued (at most :data:`PENDING` this round), send
        each a challenge, keep it pending; when every slot is taken, push out the oldest
        only if it had :data:`SHIELD` seconds, else leave the rest queued."""
        for _ in range(PENDING):
            if len(self.pending) >= PENDING:
                oldest = min(self.pending, key=lambda c: self.pending[c].since)
                if now - self.pending[oldest].since < SHIELD:
                    return
                self._drop(oldest)
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
            self.pending[conn] = _Pending(now, now + HELLO_WAIT, nonce, bytearray())

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
        if magic != MAGIC or n > MAX_NAME:
            self._drop(conn)
            return
        if len(p.got) < HELLO.size + n:
            return
        name = bytes(p.got[HELLO.size:])
        del self.pending[conn]
        if not hmac.compare_digest(answer, hello_mac(self.secret, p.nonce, peer, self.device,
                                                     name)):
            conn.close()
            return
        try:
            channel = name.decode()
        except UnicodeDecodeError:
            conn.close()
            return
        self._claim((channel, int(peer)), _Claim(conn, int(peer), p.nonce, name, False))

    def _claim(self, key: tuple[str, int], claim: _Claim) -> None:
        """Keep ``claim`` for the channel that asks for ``key`` (answered now if that
        channel is open here), unless another claimed it first: refused loudly (module
        docstring)."""
        channel, peer = key
        what = (f"two connections claimed to be device {peer} on channel "
                f"{_channel(channel)}; both refused (only a process holding the run's "
                f"link key can introduce itself: another process of this run is confused, "
                f"or the key leaked)")
        with self.lock:
            if key in self.taken:
                self._refuse(claim.sock, what)
                self.conflicts[key] = what  # the link in use fails at its next operation
                _log.error("reshard tcp: a second connection claimed to be device %d on "
                           "channel %s after the first was in use; both refused", peer,
                           _channel(channel))
            elif key in self.accepted:
                self._refuse(claim.sock, what)
                first = self.accepted.pop(key)
                if first.answered:
                    first.sock.close()
                else:
                    self._refuse(first.sock, what)
                self.conflicts[key] = what
            elif key in self.conflicts:
                self._refuse(claim.sock, self.conflicts[key])
            else:
                self.accepted[key] = claim
                if channel in self.channels:
                    self._answer(claim)

    def _answer(self, claim: _Claim) -> bool:
        """Send ``claim`` its ``Y`` and proof (a fresh socket's buffer takes it); False
        if the connection is gone."""
        proof = taken_mac(self.secret, claim.nonce, claim.device, self.device, claim.name)
        try:
            claim.sock.setblocking(True)
            claim.sock.settimeout(HELLO_WAIT)
            claim.sock.sendall(VERDICT.pack(b"Y", proof, 0))
        except OSError:
            claim.sock.close()
            return False
        claim.answered = True
        return True

    @staticmethod
    def _refuse(sock: socket.socket, reason: str) -> None:
        """Send ``N`` and ``reason``, then close."""
        try:
            sock.setblocking(True)
            sock.settimeout(0.5)
            sock.sendall(refusal(reason))
        except OSError:
            pass
        sock.close()

    def _drop(self, conn: socket.socket) -> None:
        self.pending.pop(conn, None)
        conn.close()

    def close(self) -> None:
        """Close the listener and the connections no channel took."""
        with self.lock:
            self.closed = True
            for claim in self.accepted.values():
                claim.sock.close()
            self.accepted.clear()
        self.listener.close()
        if self.listening.acquire(timeout=1.0):  # a round in progress ends within 0.05 s
            try:
                for conn in list(self.pending):
                    self._drop(conn)
            finally:
                self.listening.release()


__all__ = ["BACKLOG", "MISMATCH_WAIT", "PENDING", "SHIELD", "Hub"]

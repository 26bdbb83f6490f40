"""The tcp backend's receive window on connections between hosts
(:data:`reshard.comm.backends.tcp_frames.WINDOW`): capped where the connection leaves
the host (two addresses), the kernel's autotuning where it does not, and the
environment's override."""

from __future__ import annotations

import contextlib
import socket

import pytest

from reshard.comm.backends import tcp_frames
from reshard.comm.backends.tcp_frames import WINDOW, WINDOW_ENV, Link
from reshard.errors import ExecutionError


@contextlib.contextmanager
def _connected(there: str):
    """A socket connected from 127.0.0.1 to ``there`` (both loopback), and its peer."""
    server = socket.create_server((there, 0))
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        client.bind(("127.0.0.1", 0))
        client.connect(server.getsockname())
        peer, _ = server.accept()
        try:
            yield client, peer
        finally:
            peer.close()
    finally:
        client.close()
        server.close()


def _rcvbuf(sock: socket.socket) -> int:
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)


def _granted(asked: int) -> int:
    """What Linux grants for ``SO_RCVBUF`` = ``asked``: twice it, up to the machine's
    net.core.rmem_max."""
    with open("/proc/sys/net/core/rmem_max") as f:
        return 2 * min(asked, int(f.read()))


def test_a_connection_between_two_addresses_gets_the_window(monkeypatch):
    monkeypatch.delenv(WINDOW_ENV, raising=False)
    with _connected("127.0.0.2") as (a, b):
        before = _rcvbuf(a)
        Link(a, 1)
        assert _rcvbuf(a) == _granted(WINDOW) != before
        Link(b, 0)
        assert _rcvbuf(b) == _granted(WINDOW)


def test_a_connection_inside_one_host_keeps_the_kernels_window(monkeypatch):
    monkeypatch.delenv(WINDOW_ENV, raising=False)
    with _connected("127.0.0.1") as (a, _):
        before = _rcvbuf(a)
        Link(a, 1)
        assert _rcvbuf(a) == before


def test_the_environment_sets_or_lifts_the_window(monkeypatch):
    monkeypatch.setenv(WINDOW_ENV, str(1 << 20))
    assert tcp_frames.window() == 1 << 20
    with _connected("127.0.0.2") as (a, _):
        Link(a, 1)
        assert _rcvbuf(a) == _granted(1 << 20)
    monkeypatch.setenv(WINDOW_ENV, "0")
    with _connected("127.0.0.2") as (a, _):
        before = _rcvbuf(a)
        Link(a, 1)
        assert _rcvbuf(a) == before
    for bad in ("-1", "lots"):
        monkeypatch.setenv(WINDOW_ENV, bad)
        with pytest.raises(ExecutionError, match=WINDOW_ENV):
            tcp_frames.window()

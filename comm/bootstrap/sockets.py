"""Sockets the runtime opens: bound to one address, never the wildcard.

Single-host runtimes bind loopback; multi-host ones (the emulated testbed, a Ray
cluster) the cluster interface they were told to use. Helpers here turn such an
address into what the libraries underneath need: a listening socket for torch's
``TCPStore`` (``master_listen_fd``), and the interface name for gloo
(``GLOO_SOCKET_IFNAME``, the interface its pair sockets bind to).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import socket
import struct
import time
from collections.abc import Iterator

from reshard.core.errors import ExecutionError

_SIOCGIFADDR = 0x8915  # <linux/sockios.h>


def interface_of(address: str) -> str:
    """The name of the local network interface holding IPv4 ``address``.

    Raises:
        ExecutionError: no local interface has that address.
    """
    ip = ipaddress.ip_address(address)
    if ip.is_loopback:
        return "lo"
    names = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            names.append(name)
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                  struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    raise ExecutionError(
        f"no local network interface has address {address} (interfaces: {names}); "
        f"advertise an address of this machine, or set GLOO_SOCKET_IFNAME")


GLOO_IFNAME_ENV = "GLOO_SOCKET_IFNAME"


@contextlib.contextmanager
def gloo_interface(ifname: str | None) -> Iterator[None]:
    """``GLOO_SOCKET_IFNAME`` set to ``ifname`` while gloo makes a process group, and
    put back as it was after: the variable is read by every ``ProcessGroupGloo``
    made, and left set it would reach every child of the process (a test runner's
    later subprocesses, a Ray cluster started from it), whose own address differs.
    None: the environment as it is (a caller's own process group)."""
    if ifname is None:
        yield
        return
    before = os.environ.get(GLOO_IFNAME_ENV)
    os.environ[GLOO_IFNAME_ENV] = ifname
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(GLOO_IFNAME_ENV, None)
        else:
            os.environ[GLOO_IFNAME_ENV] = before


def is_wildcard(host: str) -> bool:
    """True for every spelling of "all interfaces": empty, ``*``, ``0.0.0.0`` and its
    short IPv4 forms (``0``, ``0.0``), ``::``, ``::0``, ``[::0]``, ``0:0:0:0:0:0:0:0``,
    ``::ffff:0.0.0.0``."""
    bare = host.strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    if bare in ("", "*"):
        return True
    try:
        ip = ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        try:  # the forms inet_aton takes ("0", "0.0", "00.0.0.0")
            return socket.inet_aton(bare) == bytes(4)
        except OSError:
            return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_unspecified or bool(mapped is not None and mapped.is_unspecified)


def recv_exact(sock: socket.socket, n: int, what: str = "connection",
               deadline: float | None = None) -> bytes:
    """Exactly ``n`` bytes from ``sock``; a ConnectionError (``"<what> closed"``) if
    the peer closes first. With ``deadline`` (``time.monotonic()`` seconds) all of them
    by then, however they trickle in (a TimeoutError past it; the socket's timeout is
    set to what is left before each read); without, the socket's own timeout applies
    to each read."""
    chunks = []
    while n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what}: {n} bytes still missing at the deadline")
            sock.settimeout(left)
        chunk = sock.recv(min(n, 1 << 16))
        if not chunk:
            raise ConnectionError(f"{what} closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def listen_on(address: str, port: int = 0, backlog: int = 128) -> socket.socket:
    """A TCP socket listening on ``address:port`` only (0: a free port; never the
    wildcard, in any spelling)."""
    if is_wildcard(address):
        raise ExecutionError(
            f"refusing to listen on the wildcard address {address!r} (every interface); "
            f"bind loopback or the cluster interface's address")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        raise ExecutionError(f"cannot listen on {address}:{port}: {e}") from e
    return sock


__all__ = ["interface_of", "listen_on"]

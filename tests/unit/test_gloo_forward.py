"""The gloo backend's relay forwarding (``GlooBackend._forward``) without gloo: receives
are Works that complete when the test says, so the order, the wake-ups, the timeout
and a failed receive are checked exactly (tests/cpu runs it on real gloo)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from reshard.comm.backends.gloo import GlooBackend
from reshard.comm.backends.gloo_works import Relay as _Relay
from reshard.errors import ExecutionError


class _Recv:
    """A receive Work that completes when ``done`` is set (or fails with ``error``)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None

    def wait(self) -> bool:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return True


def _backend(timeout: float) -> SimpleNamespace:
    sent: list[tuple[object, int]] = []

    def isend(piece: object, dst: int, group: object, tag: int) -> SimpleNamespace:
        sent.append((piece, dst))
        return SimpleNamespace(wait=lambda: True)  # a send Work, complete

    return SimpleNamespace(
        _call=lambda what, peers, fn, *a, **k: fn(*a, **k),
        _dist=SimpleNamespace(isend=isend), _p2p=None, rank_of={1: 1, 2: 2, 3: 3},
        timeout=timeout, device=1, sent=sent)


def _relay(backend: SimpleNamespace, prev: int, nxt: int, n: int) -> tuple[_Relay, list[_Recv]]:
    recvs = [_Recv() for _ in range(n)]
    pieces = [f"{prev}->{nxt}:{j}" for j in range(n)]
    return _Relay(backend, "broadcast", pieces, [(prev, recvs)], (nxt,), tag=prev), recvs


def test_pieces_go_on_in_order_as_they_arrive_from_other_threads():
    b = _backend(timeout=30.0)
    r1, recvs1 = _relay(b, 0, 2, 3)
    r2, recvs2 = _relay(b, 3, 2, 2)

    def arrive() -> None:  # interleaved, with pauses the forwarder must wait through
        for w in (recvs2[0], recvs1[0], recvs1[1], recvs2[1], recvs1[2]):
            time.sleep(0.01)
            w.done.set()

    t = threading.Thread(target=arrive)
    t.start()
    GlooBackend._forward(b, [r1, r2])  # type: ignore[arg-type]
    t.join()
    assert not r1.pending and not r2.pending
    by_relay = {p: [s for s, _ in b.sent if s.startswith(p)] for p in ("0->", "3->")}
    assert by_relay == {"0->": ["0->2:0", "0->2:1", "0->2:2"], "3->": ["3->2:0", "3->2:1"]}
    assert b.sent.index(("3->2:0", 2)) < b.sent.index(("0->2:0", 2))  # as they arrived


def test_a_relay_whose_piece_never_comes_times_out_naming_its_peer():
    b = _backend(timeout=0.2)
    r1, recvs1 = _relay(b, 0, 2, 1)
    r2, _ = _relay(b, 3, 2, 1)  # never arrives
    recvs1[0].done.set()
    t0 = time.monotonic()
    with pytest.raises(ExecutionError, match=r"no piece from device\(s\) \[3\] within 0.2s"):
        GlooBackend._forward(b, [r1, r2])  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 5  # woke at the timeout, not after a poll backlog
    assert not r1.pending  # what arrived went on


def test_a_failed_receive_wakes_the_forwarder_and_is_raised():
    b = _backend(timeout=30.0)
    r1, recvs1 = _relay(b, 0, 2, 2)
    recvs1[0].error = RuntimeError("Connection reset by peer")
    threading.Timer(0.05, recvs1[0].done.set).start()
    with pytest.raises(ExecutionError, match="Connection reset by peer"):
        GlooBackend._forward(b, [r1])  # type: ignore[arg-type]


def test_a_member_summing_two_running_sums_passes_a_piece_on_once_both_arrived():
    """A star's root (or a tree's inner addend): piece j goes on after the add saw it
    from every peer; the timeout names only the peer still behind."""
    b = _backend(timeout=0.3)
    from_0, from_3 = [_Recv() for _ in range(2)], [_Recv() for _ in range(2)]
    added: list[int] = []
    r = _Relay(b, "broadcast", ["sum:0", "sum:1"], [(0, from_0), (3, from_3)], (2,), tag=5,
               add=added.append)
    assert r.prevs == (0, 3)
    for w in (from_0[0], from_0[1], from_3[0]):
        w.done.set()
    with pytest.raises(ExecutionError, match=r"no piece from device\(s\) \[3\] within 0.3s"):
        GlooBackend._forward(b, [r, _relay(b, 1, 2, 0)[0]])  # type: ignore[arg-type]
    assert added == [0] and [s for s, _ in b.sent] == ["sum:0"]  # piece 1 waits for 3
    from_3[1].done.set()
    r.finish()  # blocks on each peer's piece in turn, then the forwarding sends
    assert added == [0, 1] and [s for s, _ in b.sent] == ["sum:0", "sum:1"]

"""gloo ranks on threads of one process are refused at once, on every rank, with the
reason and the alternatives (torch.distributed holds one world per process: they used
to wait on each other's keys until the timeout, then raise DistStoreError)."""

from __future__ import annotations

import threading
import traceback

import pytest

from ._helpers import rank_results

pytestmark = pytest.mark.cpu

WORLD = (0, 1, 2, 3)
LONG = 600.0  # the backend's timeout: a rank that waited for it fails the test's own


def _ranks_on_threads(devices, world, rendezvous) -> dict[int, str]:
    """``Executor.create("gloo", ...)`` for each of ``devices`` on a thread of this
    process; each one's error (or "created")."""
    from reshard.comm.executor import Executor

    got: dict[int, str] = {}

    def rank(d: int) -> None:
        try:
            Executor.create("gloo", d, world, rendezvous(), LONG).close()
            got[d] = "created"
        except BaseException as e:  # noqa: BLE001 - reported to the test
            got[d] = f"{type(e).__name__}: {e}"

    threads = [threading.Thread(target=rank, args=(d,)) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LONG)
    return got


@pytest.mark.timeout(120)
def test_gloo_ranks_on_threads_are_refused_at_once_naming_the_alternative():
    pytest.importorskip("torch")
    from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer

    server = TcpRendezvousServer()
    try:
        got = _ranks_on_threads(WORLD, WORLD, lambda: server.address.connect(10))
    finally:
        server.close()
    assert sorted(got) == list(WORLD)
    for d, text in got.items():
        assert text.startswith("ExecutionError"), (d, text)
        assert f"device {d}: gloo needs a process per rank, but 4 of its 4 ranks run in " \
               f"this process" in text
        assert "a process of its own" in text and "backend 'tcp'" in text


def _mixed(device, address, results, done) -> None:
    """Process "0" runs devices 0 and 1 on threads; process "2" runs device 2."""
    try:
        devices = (0, 1) if device == 0 else (2,)
        results.put((device, _ranks_on_threads(devices, (0, 1, 2),
                                               lambda: address.connect(10))))
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((device, traceback.format_exc()))


@pytest.mark.timeout(120)
def test_a_rank_in_a_process_of_its_own_is_refused_with_the_ones_that_share():
    """Every rank fails, also the one alone in its process: the others never join."""
    pytest.importorskip("torch")
    got = rank_results(_mixed, (0, 2), wait=100)
    texts = {**got[0], **got[2]}
    assert sorted(texts) == [0, 1, 2]
    assert "2 of its 3 ranks run in this process" in texts[0] + texts[1]
    assert "some of its 3 ranks share another process" in texts[2]
    assert all(t.startswith("ExecutionError") for t in texts.values()), texts

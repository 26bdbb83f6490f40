"""reshard.version_gate: the states of an engine rank's buffer sets, step by step (one
thread, or a reader thread blocked on a known condition): a failed in-place write
leaves the set refused, never readable under the old label; a failed double-buffered
write leaves readers on the last whole version; landing is one step, so a reader waiting
on a write is told the version it then holds."""

from __future__ import annotations

import threading

import pytest

from reshard.errors import ExecutionError, ReshardError
from reshard.version_gate import POLICIES, Failure, VersionGate


def _read(gate: VersionGate) -> int:
    i, version = gate.enter()
    gate.leave(i)
    return version


def test_each_mode_has_its_policy_and_an_unknown_one_is_refused():
    assert list(POLICIES) == ["double", "lock", "none"]
    assert [p.sets for p in POLICIES.values()] == [2, 1, 1]
    with pytest.raises(ReshardError, match=r"mode='swap'; valid: \['double', 'lock', 'none'\]"):
        VersionGate("swap", "device 0")


@pytest.mark.parametrize("mode", ["lock", "none"])
def test_a_failed_in_place_write_refuses_readers_until_a_version_lands(mode):
    gate = VersionGate(mode, "device 2")
    t = gate.begin()
    gate.publish(t, 14)
    assert _read(gate) == 14
    t = gate.begin()
    gate.fail(t, 15, "ExecutionError: device 0 closed the connection")
    assert gate.failure == Failure(15, "ExecutionError: device 0 closed the connection")
    assert gate.landed == 14  # the last whole version, but no reader gets it
    with pytest.raises(ExecutionError, match=r"device 2: the weights hold no whole version "
                                             r"in mode '\w+': the sync of version 15 failed"):
        gate.enter()
    with pytest.raises(ExecutionError, match="version 15 will not land: the sync of version "
                                             "15 failed here"):
        gate.wait_landed(15, timeout=5)
    t = gate.begin()
    gate.publish(t, 16)
    assert gate.failure is None and _read(gate) == 16


def test_a_failed_double_buffered_write_leaves_readers_on_the_last_version():
    gate = VersionGate("double", "device 2")
    first = gate.begin()
    gate.publish(first, 14)
    held, version = gate.enter()  # a reader holds 14 through the failed write
    second = gate.begin()
    assert second != held
    gate.fail(second, 15, "ExecutionError: timeout")
    assert version == 14 and _read(gate) == 14
    gate.leave(held)
    with pytest.raises(ExecutionError, match="version 15 will not land"):
        gate.wait_landed(15, timeout=5)
    assert gate.wait_landed(14, timeout=0) == 14
    again = gate.begin()  # the torn set is written again, the live one kept
    assert again == second
    gate.publish(again, 16)
    assert _read(gate) == 16


def test_a_reader_waiting_on_a_lock_write_is_told_the_version_it_gets():
    gate = VersionGate("lock", "device 2")
    t = gate.begin()
    gate.publish(t, 3)
    t = gate.begin()  # writing version 4: new readers wait
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.append(_read(gate)))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive() and not got  # waiting while the sync writes
    gate.publish(t, 4)
    reader.join(5)
    assert got == [4]


def test_a_lock_write_waits_for_the_readers_it_would_overwrite():
    gate = VersionGate("lock", "device 2")
    held, _ = gate.enter()
    began = threading.Event()
    writer = threading.Thread(target=lambda: (gate.begin(), began.set()))
    writer.start()
    assert not began.wait(0.2)  # the reader still holds the set
    gate.leave(held)
    assert began.wait(5)
    writer.join(5)


def test_none_mode_readers_during_a_write_get_the_last_label():
    gate = VersionGate("none", "device 2")
    t = gate.begin()
    gate.publish(t, 7)
    gate.begin()  # writing 8 in place, readers not stopped (they may see a mix)
    assert _read(gate) == 7


def test_one_writer_at_a_time_and_the_timeout_is_named():
    gate = VersionGate("double", "device 5")
    gate.begin()
    with pytest.raises(ReshardError, match="device 5: a sync began while another"):
        gate.begin()
    with pytest.raises(ExecutionError, match=r"device 5: version 0 did not land within "
                                             r"0\.05s; the last one that did: -1"):
        gate.wait_landed(0, timeout=0.05)

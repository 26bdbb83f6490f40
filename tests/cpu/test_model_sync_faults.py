"""reshard.model_sync under a crash: a trainer rank SIGKILLed inside a sync (one process
per rank, microbench/model_sync_soak.py's rounds) leaves no engine reader holding a
torn or mislabelled version. In "lock" mode the failed in-place write leaves the
buffers refused (naming the failed version), in "double" mode readers stay on the last
whole version; every surviving rank's sync of that version fails, the other trainer's
included (its bytes left, the engines never confirmed them)."""

from __future__ import annotations

import pytest

from reshard.microbench.model_sync_soak import ENGINE, VICTIM, WORLD, Soak, run_round

from .test_tcp_backend import PLANES

pytestmark = pytest.mark.cpu

CRASH = 15


def _crash(mode: str, plane: str) -> dict[int, dict]:
    """A round of 17 syncs whose victim dies in sync 15 before sending a byte of it, the
    other trainer's bytes of 15 landing first (``hold``): the engines' buffers hold
    both versions when their sync fails."""
    timeout = 10.0 if plane == "tcp" else 5.0  # nixl sees a dead peer at its timeout
    return run_round(Soak(mode, syncs=CRASH + 2, crash_at=CRASH, hold=True, backend=plane,
                          timeout=timeout, after=0.5), wait=240)


def _check_survivors(got: dict[int, dict]) -> None:
    assert set(got) == set(WORLD) - {VICTIM}
    for d in ENGINE.devices:
        r = got[d]
        assert r["torn"] == 0 and r["mislabelled"] == 0, (d, r)
        assert r["whole"] > 0 and r["versions"] >= 2, (d, r)  # reads overlapped syncs
        assert r["version"] == CRASH - 1, (d, r)  # the last whole version
    for d, r in got.items():  # the other trainer's too: the engines never confirmed
        assert r["failed"].startswith(f"sync {CRASH} failed"), (d, r["failed"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("plane", PLANES)
def test_a_trainer_killed_mid_sync_leaves_lock_readers_refused_not_torn(plane):
    got = _crash("lock", plane)
    _check_survivors(got)
    for d in ENGINE.devices:
        assert got[d]["refused"] > 0, got[d]  # read on after the failure: refused
        assert f"the sync of version {CRASH} failed" in got[d]["refusal"], got[d]


@pytest.mark.timeout(300)
def test_a_trainer_killed_mid_sync_leaves_double_readers_on_the_last_version():
    got = _crash("double", "tcp")
    _check_survivors(got)
    for d in ENGINE.devices:
        assert got[d]["refused"] == 0, got[d]
